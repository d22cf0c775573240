"""``sakura bench-device`` at a named model geometry (seeded random weights, built in memory): the model has
the geometry's dims, and the report says which geometry it timed, with how many tokens."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from sakura.cli.bench_device import bench_device_cmd
from sakura.cli.errors import friendly
from sakura.model.base import CodecConfig
from sakura.model.geometry import GEOMETRIES, Flux2Geometry, geometry_model, get_geometry

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
                 ["--model", str(tmp_path / "missing")], ["--layout", "v3"], ["--basis", "auto"],
                 ["--pack", str(tmp_path / "p.pack"), "--layout", "allocated"]):
        r = bench_device("--random-cache", "-e", "eager", "-r", "torch", "-o", str(tmp_path / "x.json"), *args)
        assert r.exit_code == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (args, r.output)


def test_rank_at_budget_is_where_the_fitted_rebuild_line_meets_the_budget():
    from sakura.eval.device_bench_report import rank_at_budget

    # rebuild = 2 ms + 0.05 ms per rank; execute 100 ms → 10 ms at rank 160
    assert rank_at_budget([32, 64, 128], [3.6, 5.2, 8.4], 100.0) == 160
    assert rank_at_budget([32, 64, 128], [3.6, 5.2, 8.4], 100.0, budget=0.05) == 60
    assert rank_at_budget([32, 64, 128], [30.0, 40.0, 50.0], 100.0) == 0  # even rank 0 is over
    assert rank_at_budget([64, 64], [5.0, 6.0], 100.0) is None  # one rank: no slope
    assert rank_at_budget([32, float("nan"), None], [3.0, 4.0, 5.0], 100.0) is None
    assert rank_at_budget([32, 64], [5.0, 4.0], 100.0) is None  # not growing with rank


@pytest.mark.parametrize("basis", ["shard", "unit"])
def test_bench_device_builds_a_v2_pack_and_reports_its_levels(small, tmp_path, basis):
    out = tmp_path / "bench.json"
    # the captured cache (not --random-cache): random K/V have no token subspace in common, so a shared basis
    # would not reach its target there and every shard would fall back to one basis per unit
    r = bench_device("-t", "fs-astronaut", "--geometry", "test-small", "--geometry-layers", "1,2", "--shard-size", "2",
                     "--max-rank", "8", "--layout", "allocated", "--basis", basis, "-c", "R,8,8",
                     "-c", "8,4,4", "-e", "eager", "-r", "torch", "--repeats", "1", "--threads", "1", "-o", str(out))
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    pk = rep["pack"]
    # built as `sakura build` writes v2 (builder.pack_options): a shared basis factorises to 4 × 8, one per unit 2 × 8
    assert (pk["version"], pk["layout"], pk["basis"], pk["shared_basis"]) == (2, "allocated", basis, basis == "shard")
    assert pk["options"]["max_rank"] == (32 if basis == "shard" else 16) and pk["options"]["reference_rank"] == 8
    if basis == "shard":
        assert pk["shared_shards"] >= 1
    else:
        assert pk["shared_shards"] == 0
    # every config read a v2 level (a chunk count), whose rank and bytes the report carries
    assert set(rep["levels"]) == {f"r{pk['rank']}-a8-b8", "r8-a4-b4"}
    for name, lv in rep["levels"].items():
        assert len(lv["shards"]) == pk["shards"] == 4
        for s, row in enumerate(lv["shards"]):
            assert len(row["key"]) == 1 and 0 < row["r"] <= pk["rank"]
            assert row["bytes"] == rep["shards"][s]["bytes"][name] > 0
    top, low = rep["levels"][f"r{pk['rank']}-a8-b8"], rep["levels"]["r8-a4-b4"]
    assert top["kib_mean"] > low["kib_mean"] and top["rank_mean"] >= low["rank_mean"]
    assert f"config r8-a4-b4: level rank {low['rank_mean']:.0f}" in r.stderr and "level rank" in r.stdout
    assert set(rep["summary"]["rank_at_budget"]) == {"torch/eager"}


def test_bench_device_caps_the_built_packs_rank(small, tmp_path):
    out = tmp_path / "bench.json"
    r = bench_device("-t", "fs-astronaut", "--geometry", "test-small", "--geometry-layers", "1,2", "--shard-size", "2",
                     "--max-rank", "8", "--layout", "allocated", "--basis", "shard", "--rebuild-rank", "12",
                     "-c", "R,8,8", "-c", "8,4,4", "-e", "eager", "-r", "torch", "--repeats", "1", "--threads", "1",
                     "-o", str(out))
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    assert rep["pack"]["options"]["max_rank"] == 12 and rep["pack"]["rank"] <= 12
    assert all(row["r"] <= 12 for lv in rep["levels"].values() for row in lv["shards"])
    r = bench_device("--pack", str(out), "--rebuild-rank", "12", "-o", str(tmp_path / "x.json"))
    assert r.exit_code == 2 and "not with --pack" in r.stderr


def test_bench_device_v1_pack_levels_are_its_configs(small, tmp_path):
    out = tmp_path / "bench.json"
    r = bench_device("-t", "fs-astronaut", "--geometry", "test-small", "--geometry-layers", "1,2", "--random-cache",
                     "--max-rank", "8", "-c", "R,4,4", "-c", "8,2,2", "-e", "eager", "-r", "torch", "--repeats", "1",
                     "--threads", "1", "-o", str(out))
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    assert (rep["pack"]["version"], rep["pack"]["layout"], rep["pack"]["shared_shards"]) == (1, "uniform", 0)
    assert [row["r"] for row in rep["levels"]["r8-a2-b2"]["shards"]] == [8] * 4
