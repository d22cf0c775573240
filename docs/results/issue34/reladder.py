"""Replace the ladder of every v3 pack in a folder with this code's (its allocated chunks kept byte for byte).

    python docs/results/issue34/reladder.py PACKS [TEMPLATE_ID...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from sakura.offline.builder import load_importance
from sakura.offline.ladder import add_ladder


def main(packs: Path, ids: list[str]) -> None:
    for tid in ids or sorted(p.stem for p in packs.glob("*.pack") if "." not in p.stem):
        info = add_ladder(packs / f"{tid}.pack", packs / f"{tid}.fp16.pack", f"{tid}.fp16", load_importance(packs, tid))
        print(tid, info.storage())


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
