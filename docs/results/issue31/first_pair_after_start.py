"""Time from starting ``sakura study serve`` (a prepared pool, packs published) to a newcomer seeing the first
pair, on a copy of the study folder (the study's own participants are left alone).

    .venv/bin/python docs/results/issue31/first_pair_after_start.py --data runs/study --packs packs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CODE = "import sys; from sakura.cli import main; sys.argv[0] = 'sakura'; sys.exit(main())"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="runs/study")
    ap.add_argument("--packs", default="packs")
    ap.add_argument("--templates", default="fs-astronaut,vton-astronaut,mb-coffee")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "study"
        shutil.copytree(a.data, data)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CODE, "study", "serve", "--port", "0", "--operator-port", "0",
                                 "--no-build", "--packs", a.packs, "--templates", a.templates, "--data", str(data)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            text = ""
            while "participants:" not in text:
                text += proc.stdout.readline()
            url = re.search(r"participants: (http://\S+)", text).group(1)
            listening = time.perf_counter() - t0
            with httpx.Client(base_url=url, follow_redirects=True, timeout=30) as c:
                c.post("/consent").raise_for_status()
                d = c.get("/api/next").json()
                for src in (d["left"], d["right"]):
                    c.get(src).raise_for_status()
            first = time.perf_counter() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    res = {"listening_s": round(listening, 3), "first_pair_s": round(first, 3), "state": d["state"]}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
