"""Fig. 15's static sweep (quality vs bytes over each system's range) and its equal-quality arithmetic."""

import json
from functools import partial

import pytest

from sakura.eval import bench, equal_bytes, figures
from sakura.eval.equal_bytes import bytes_at, compare, measure, pareto, quality_at, within


@pytest.fixture(scope="module")
def prepared(fs_packs):
    packs, template = fs_packs
    return bench.prepare_template(template, packs, max_rank=32, say=lambda s: None, repeats=1)


@pytest.fixture(scope="module")
def fig15(prepared, tmp_path_factory):
    """``sakura bench --figure 15`` on one template: 1 request, 5 SAKURA budgets."""
    out = tmp_path_factory.mktemp("fig15")
    cfg = bench.BenchConfig(workloads=("fs",), packs=prepared.packs, max_rank=32)
    mp = pytest.MonkeyPatch()
    mp.setattr(bench, "workload_benches", lambda w, c, cache, say: [prepared])
    mp.setitem(figures.FIGURES, "15", partial(equal_bytes.fig15_bytes_quality, requests=1, budgets=5))
    try:
        written = figures.run(cfg, out, figure="15", say=lambda s: None)
    finally:
        mp.undo()
    return written, json.loads((out / "fig15_bytes_quality.json").read_text())


def test_figure_files_written(fig15):
    written, data = fig15
    assert [p.name for p in written] == ["fig15_bytes_quality.png", "fig15_bytes_quality.json"]
    assert all(p.stat().st_size > 0 for p in written)
    fs = data["workloads"]["fs"]
    assert set(fs["curves"]) == {"sakura", "sakura-v1", "intq", "cachegen"}  # v2 pack beside the v1 one
    assert set(fs["comparison"]) == {"sakura-v1", "intq", "cachegen"}
    paired = fs["comparison"]["sakura-v1"]["psnr_masked"]["paired"]  # v2 vs v1 pack, edit by edit
    assert paired["edits"] == 1
    assert len(fs["curves"]["intq"]) == 4  # every stored bit width is a point


def test_sakura_budgets_monotone_in_bytes(fig15):
    pts = fig15[1]["workloads"]["fs"]["curves"]["sakura"]
    assert len(pts) >= 3
    budgets = [p["budget_per_shard"] for p in pts]
    assert budgets == sorted(budgets)  # listed by bytes: a larger budget never sends fewer bytes
    assert len({p["bytes"] for p in pts}) == len(pts)
    assert pts[-1]["psnr_masked"] > pts[0]["psnr_masked"]


class CountingSource:
    def __init__(self, source):
        self.source, self.fetched = source, 0

    def fetch(self, fid, ranges):
        self.fetched += sum(n for _, n in ranges)
        return self.source.fetch(fid, ranges)


@pytest.mark.parametrize("system", ["sakura", "sakura-v1", "intq", "cachegen"])
def test_bytes_are_the_fetched_ranges(prepared, system):
    src = CountingSource(prepared.runtime.source)
    enc = prepared.runtime.encoding(prepared.state, equal_bytes.format_of(system))
    choose = within(2 * min(lv.nbytes for lv in enc.units[0].levels))
    point = measure(prepared, system, choose, [0], source=src)
    assert point["bytes"] == src.fetched > 0
    if system.startswith("sakura"):  # a shard's level is exactly its frontier point's bytes
        assert point["bytes"] == sum(choose(u).nbytes for u in enc.units)


def test_equal_quality_and_equal_bytes_interpolation():
    ours = [(1e3, 30.0), (1e4, 40.0), (1e5, 44.0)]
    other = [(1e4, 30.0), (3e4, 29.0), (1e5, 40.0)]  # (3e4, 29) is dominated: not on the curve
    assert list(pareto(other)[1]) == [30.0, 40.0]
    assert bytes_at(pareto(ours), 35.0) == pytest.approx(10 ** 3.5)
    assert quality_at(pareto(other), 10 ** 4.5) == pytest.approx(35.0)
    assert bytes_at(pareto(ours), 50.0) is None and quality_at(pareto(ours), 1e6) is None
    c = compare(ours, other, n=3)
    # equal quality 30..40: SAKURA needs a tenth of the bytes everywhere
    assert [r["saving"] for r in c["equal_quality"]["points"]] == pytest.approx([0.9, 0.9, 0.9])
    # equal bytes 1e4..1e5: 40 vs 30, 42 vs 35, 44 vs 40
    assert [r["gain"] for r in c["equal_bytes"]["points"]] == pytest.approx([10.0, 7.0, 4.0])
    assert c["equal_bytes"]["mean_gain"] == pytest.approx(7.0)


def test_no_overlap_is_reported_not_extrapolated():
    c = compare([(1e3, 30.0), (1e4, 35.0)], [(1e6, 45.0), (1e7, 50.0)])
    assert c["equal_quality"] is None and c["equal_bytes"] is None
    assert c["other_bytes"] == pytest.approx([1e6, 1e7])
    notes = equal_bytes.overlap_notes("fs", {"cachegen": {"psnr_masked": c}})
    assert "no equal-psnr_masked overlap" in notes[0] and "no equal-bytes overlap" in notes[0]


def test_paired_savings_compare_each_edit_with_itself():
    # Two edits on different quality scales; on each, ours needs 0.7x the other's bytes at every
    # quality. Pooled means mix the scales; the edit-by-edit comparison recovers 30 % in every band.
    def rows(scale):
        return [{"per_template": [{"template": "t", "bytes": b * scale,
                                   "per_request": [{"psnr_masked": 40 + 5 * k}, {"psnr_masked": 50 + 9 * k}]}]}
                for k, b in enumerate([1e4, 2e4, 4e4, 8e4])]
    got = equal_bytes.paired_savings(rows(0.7), rows(1.0))
    assert got["edits"] == 2 and set(got["bands"]) == {"low", "mid", "high"}
    assert all(v["median"] == pytest.approx(0.3) for v in got["bands"].values())
    worse = equal_bytes.paired_savings(rows(1.5), rows(1.0))
    assert worse["median"] == pytest.approx(-0.5)
    assert equal_bytes.paired_savings(rows(1.0)[:1], rows(1.0)) is None  # one point: no overlap to compare
