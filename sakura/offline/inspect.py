"""What a template's stored files cost: `sakura pack-info`."""

from __future__ import annotations

from pathlib import Path

from sakura.offline.builder import ENCODING_SUFFIX, file_id
from sakura.offline.cachegen import CacheGenReader
from sakura.offline.intq import IntQReader
from sakura.offline.pack import PackReader


def pack_summary(pack_dir: str | Path, template_id: str) -> dict:
    pack_dir = Path(pack_dir)
    main = pack_dir / f"{file_id(template_id, 'sakura')}.pack"
    if not main.exists():
        raise FileNotFoundError(f"no pack {main} (build it with `sakura build --out {pack_dir} --templates {template_id}`)")
    reader = PackReader(main)
    info = reader.info
    storage = {"sakura": main.stat().st_size}
    out: dict = {"template_id": info.template_id, "model_id": info.model_id, "shards": info.num_shards,
                 "header_bytes": len(reader.header_bytes),
                 "frontier_sizes": [len(info.frontier(s)) for s in range(info.num_shards)],
                 "geometry": dict(info.header["geometry"]), "q": info.header.get("build", {}).get("q")}
    g = info.geometry
    out["fp16_bytes"] = 2 * g.num_steps * g.num_layers * g.n * g.d * 2
    for enc in ENCODING_SUFFIX:
        path = pack_dir / f"{file_id(template_id, enc)}.pack"
        if enc == "sakura" or not path.exists():
            continue
        storage[enc] = path.stat().st_size
    if "intq" in storage:
        r = IntQReader(pack_dir / f"{file_id(template_id, 'intq')}.pack")
        out["intq_per_width"] = {f"int{b}": r.info.storage_bytes(b) for b in r.info.bits}
    if "cachegen" in storage:
        c = CacheGenReader(pack_dir / f"{file_id(template_id, 'cachegen')}.pack")
        out["cachegen_per_level"] = {f"L{lv}": c.info.storage_bytes(lv) for lv in range(c.info.num_levels)}
    out["storage"] = storage
    out["compression_vs_fp16"] = {k: out["fp16_bytes"] / v for k, v in storage.items()}
    return out
