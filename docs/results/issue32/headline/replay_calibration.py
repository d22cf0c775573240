"""Replay the headline's calibration on another machine: copy one machine's section of a calibration file under this
machine's fingerprint (marked ``replayed_from``), so `sweep.sh` simulates the same device compute, link round trip and
trace scales as the runs before it. Rebuilds are still timed on this machine (`--rebuild-clock cpu`).

    python docs/results/issue32/headline/replay_calibration.py CALIBRATION.json [--cpu "AMD EPYC"]
"""

import argparse
import copy
import json
from pathlib import Path

import torch

from sakura.runtime.calibration import CalibrationStore


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("calibration", type=Path)
    ap.add_argument("--cpu", default="AMD EPYC", help="the section to replay: the machine whose cpu this is")
    a = ap.parse_args()
    torch.set_num_threads(1)  # (the fingerprint records the bench's one thread)
    data = json.loads(a.calibration.read_text())
    src_key, src = next((k, m) for k, m in data["machines"].items() if m["machine"]["cpu"] == a.cpu)
    store = CalibrationStore()  # (no file: only this machine's fingerprint and the key the store files it under)
    here, key = store.machine, store.machine_key
    if key == src_key:
        print(f"{a.calibration}: this machine is the one it was measured on ({a.cpu})")
        return
    section = copy.deepcopy(src)
    section["machine"], section["replayed_from"] = here, {"key": src_key, "machine": src["machine"]}
    data["machines"][key] = section
    a.calibration.write_text(json.dumps(data, indent=1))
    print(f"{a.calibration}: {here['cpu']} replays {a.cpu}'s section ({len(section['profiles'])} templates)")


if __name__ == "__main__":
    main()
