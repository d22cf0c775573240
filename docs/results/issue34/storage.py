"""Storage per template with the ladder (issue #34), both ways, from a pack folder built by `sakura build`.

    python docs/results/issue34/storage.py PACKS

Per template: FP16 file; the pack alone (its allocated levels, header included); its residual rungs;
FP16 / (pack + every rung that is not the FP16 file itself); and the total stored for the template by
SAKURA's ladder: pack + rungs + the FP16 file the exact rung refers to (the fp16 format's own file, stored
once whether or not a pack refers to it). Also v1, IntQ and CacheGen files for scale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sakura.formats import FORMATS, file_id
from sakura.formats.ladder import LadderPackInfo
from sakura.formats.pack import PackInfo


def main(packs: Path) -> None:
    print("| template | FP16 MB | pack MB | rungs MB | pack + rungs MB | FP16 / (pack + rungs) | "
          "stored with FP16 MB | FP16 / pack alone | IntQ MB | CacheGen MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(packs.glob("*.pack")):
        tid = path.stem
        if "." in tid:
            continue
        info = PackInfo.open(path)[1]
        if not isinstance(info, LadderPackInfo):
            print(f"| {tid} | (pack version {info.version}: no ladder) |")
            continue
        st = info.storage()
        size = {f: (packs / f"{file_id(tid, f)}.pack").stat().st_size for f in ("intq", "cachegen")
                if (packs / f"{file_id(tid, f)}.pack").exists()}
        mb = lambda n: f"{n / 1e6:.2f}"  # noqa: E731
        fp16, both = st["fp16"], st["pack"] + st["rungs"]
        print(f"| {tid} | {mb(fp16)} | {mb(st['pack'])} | {mb(st['rungs'])} | {mb(both)} | {fp16 / both:.2f}× | "
              f"{mb(both + fp16)} | {fp16 / st['pack']:.2f}× | {mb(size.get('intq', 0))} | "
              f"{mb(size.get('cachegen', 0))} |")
    assert FORMATS["fp16"].suffix == ".fp16"


if __name__ == "__main__":
    main(Path(sys.argv[1]))
