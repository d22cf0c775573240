"""What a template's stored files cost: `sakura pack-info`."""

from __future__ import annotations

from pathlib import Path

from sakura.formats import FORMATS
from sakura.formats.pack import PackReader


def _field(obj, key: str):
    return obj.get(key) if isinstance(obj, dict) else None


def pack_summary(pack_dir: str | Path, template_id: str) -> dict:
    pack_dir = Path(pack_dir)
    main = pack_dir / f"{FORMATS['sakura'].file_id(template_id)}.pack"
    if not main.exists():
        raise FileNotFoundError(
            f"no pack {main} (build it with `sakura build --out {pack_dir} --templates {template_id}`)"
        )
    reader = PackReader(main)
    info = reader.info
    out: dict = {"template_id": info.template_id, "model_id": info.model_id, "shards": info.num_shards,
                 "header_bytes": len(reader.header_bytes),
                 "frontier_sizes": [len(info.frontier(s)) for s in range(info.num_shards)],
                 "geometry": dict(info.header["geometry"]), "q": _field(info.header.get("build"), "q")}
    g = info.geometry
    out["fp16_bytes"] = 2 * g.num_steps * g.num_layers * g.n * g.d * 2
    storage, infos = {}, {}
    for fmt in FORMATS.values():
        path = pack_dir / f"{fmt.file_id(template_id)}.pack"
        if path.exists():
            storage[fmt.name] = path.stat().st_size
            infos[fmt.name] = fmt.open(path)
    if "intq" in infos:
        out["intq_per_width"] = {f"int{b}": infos["intq"].storage_bytes(b) for b in infos["intq"].bits}
    if "cachegen" in infos:
        levels = range(infos["cachegen"].num_levels)
        out["cachegen_per_level"] = {f"L{lv}": infos["cachegen"].storage_bytes(lv) for lv in levels}
    out["storage"] = storage
    if hasattr(info, "storage"):  # a pack with the ladder (v3): the pack alone, its rungs, the FP16 file referred to
        out["ladder_storage"] = info.storage()
    out["compression_vs_fp16"] = {k: out["fp16_bytes"] / v for k, v in storage.items()}
    return out
