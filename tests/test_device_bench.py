"""``sakura bench-device`` at a named model geometry (seeded random weights, built in memory): the model has
the geometry's dims, and the report says which geometry it timed, with how many tokens."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from sakura.cli_errors import friendly
from sakura.model.base import CodecConfig
from sakura.model.geometry import GEOMETRIES, Flux2Geometry, geometry_model, get_geometry
from sakura.runtime.device_bench import bench_device_cmd

# Nothing like the template's own model (sakura-tiny: 4 × 64 heads, 8 layers, 256² at patch 8 → 1024 tokens):
# were --geometry ignored, every dim below would come out different.
SMALL = Flux2Geometry("test-small", "Small Test", heads=3, head_dim=16, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
                      num_double=4, num_single=6, codec=CodecConfig(resolution=128, patch=8, ref_size=32, num_steps=2))


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setitem(GEOMETRIES, SMALL.name, SMALL)
    return SMALL


def bench_device(*args: str):
    app = typer.Typer()
    app.command()(friendly(bench_device_cmd))
    return CliRunner().invoke(app, list(args))


def test_klein_geometry_is_registered_with_its_dims():
    g = get_geometry("flux2-klein-4b")
    assert (g.heads, g.head_dim, g.d, g.mlp_ratio) == (24, 128, 3072, 3.0)
    assert (g.num_double, g.num_single, g.codec.num_steps) == (5, 20, 4)
    assert sum(g.axes_dims_rope) == g.head_dim and g.codec.num_tokens == 1024  # klein's 32 × 32 latent grid at 512²


def test_geometry_model_has_the_requested_dims(small):
    m = geometry_model("test-small", "1,2")
    cfg = m.transformer.config
    assert (cfg.num_attention_heads, cfg.attention_head_dim, cfg.mlp_ratio) == (3, 16, 2.0)
    assert (len(m.transformer.transformer_blocks), len(m.transformer.single_transformer_blocks)) == (1, 2)
    assert m.num_layers == 3 and m.codec == SMALL.codec and m.model_id == "test-small-d1s2-random"
    mlp = m.transformer.single_transformer_blocks[0].attn.to_qkv_mlp_proj
    assert mlp.in_features == 48 and mlp.out_features == 3 * 48 + 2 * int(2.0 * 48)  # qkv + SwiGLU (mlp_ratio 2)


def test_bench_device_runs_at_the_geometry_and_reports_it(small, tmp_path):
    out = tmp_path / "bench.json"
    r = bench_device("-t", "fs-astronaut", "--geometry", "test-small", "--geometry-layers", "1,2", "--shard-size", "2",
                     "--random-cache", "--max-rank", "8", "-c", "R,4,4", "-c", "8,2,2", "-e", "eager", "-r", "torch",
                     "--repeats", "1", "--threads", "1", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "geometry of Small Test, random weights: times only" in r.stdout
    rep = json.loads(out.read_text())
    g = rep["geometry"]
    assert rep["model"] == "test-small-d1s2-random"
    assert rep["note"] == "geometry of Small Test, random weights: times only"
    assert (g["d"], g["heads"], g["head_dim"], g["layers"], g["steps"]) == (48, 3, 16, 3, 2)
    assert (g["double_blocks"], g["single_blocks"], g["model_blocks"], g["geometry"]) == (1, 2, [4, 6], "test-small")
    assert g["image_tokens"] == 256 and g["masked_tokens"] + g["reused_tokens"] == 256 and g["masked_tokens"] > 0
    assert g["reference_tokens"] == (32 // 8) ** 2 and "random" in g["weights"] and rep["torch_threads"] == 1
    # the pack and the shards were built at that geometry: n reused tokens × d, 2 steps × 2 shards of ≤ 2 layers
    assert (rep["pack"]["n"], rep["pack"]["d"], rep["pack"]["shards"]) == (g["reused_tokens"], 48, 4)
    assert [row["layers"] for row in rep["shards"][:2]] == [[0, 2], [2, 3]]
    by_config = rep["summary"]["rebuild_over_execute_by_config"]["torch/eager"]
    assert set(by_config) == {"r8-a4-b4", "r8-a2-b2"} and all(v > 0 for v in by_config.values())


def test_bench_device_model_options_fail_in_one_line(small, tmp_path):
    for args in (["--geometry", "nope"], ["--geometry", "test-small", "--geometry-layers", "0,0"],
                 ["--geometry", "test-small", "--model", str(tmp_path)], ["--geometry-layers", "1,1"],
                 ["--model", str(tmp_path / "missing")]):
        r = bench_device("--random-cache", "-e", "eager", "-r", "torch", "-o", str(tmp_path / "x.json"), *args)
        assert r.exit_code == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (args, r.output)
