"""The streamed edit on the real clock (real server, real sockets) and on the simulated clock."""

import numpy as np
import pytest
import torch

from sakura.editing import edit_request, model_for
from sakura.net.client import RangeClient
from sakura.net.shaping import RateSpec
from sakura.net.traces import load_trace
from sakura.offline.builder import file_id
from sakura.online.encodings import encoding_from_header
from sakura.online.policies import get_policy
from sakura.runtime.compute import ComputeProfile, measure_compute, zero_cache
from sakura.runtime.sim import LinkModel, simulate
from sakura.runtime.stream import StreamedEdit, StreamError, read_header
from sakura.server.run import start_server


@pytest.fixture(scope="module")
def setup(fs_packs):
    packs, tpl = fs_packs
    model = model_for(tpl)
    req = edit_request(tpl, tpl.eval_requests[0])
    compute = measure_compute(model, req, zero_cache(model, req), shard_size=2, repeats=2)
    with start_server(packs, port=0, process=True) as srv:
        yield packs, tpl, model, req, compute, srv.url


def local_from_levels(packs, tpl, encoding_name, levels, model, req):
    """The edit built locally (no network) from the same per-unit levels."""
    raw = (packs / f"{file_id(tpl.id, encoding_name)}.pack").read_bytes()
    enc = encoding_from_header(encoding_name, raw).fresh()
    kv = {}
    enc.set_preamble([raw[o:o + n] for o, n in enc.preamble_ranges()])
    for unit, label in zip(enc.units, levels):
        level = next(lv for lv in unit.levels if lv.label == label)
        kv.update(enc.decode(unit, level, [raw[o:o + n] for o, n in enc.ranges(unit, level)]))
    return model.masked_edit(req, lambda s, l: kv[(s, l)]).image


@pytest.mark.parametrize("system", ["sakura", "cachegen"])
def test_unlimited_stream_equals_local_edit_from_same_configs(setup, system):
    packs, tpl, model, req, compute, base = setup
    link = RangeClient(base)
    pol = get_policy(system)
    fid = file_id(tpl.id, pol.encoding)
    enc = encoding_from_header(pol.encoding, read_header(link, fid))
    res, tl = StreamedEdit(model, enc, pol, link, fid, compute, initial_bps=1e12).run(req)
    levels = [u.level for u in tl.units]
    assert len(levels) == len(enc.units)
    if system == "sakura":  # unlimited bandwidth: the best stored configuration everywhere
        assert all(lv == enc.units[i].levels[-1].label for i, lv in enumerate(levels))
    np.testing.assert_array_equal(res.image, local_from_levels(packs, tpl, pol.encoding, levels, model, req))
    # bounded device memory: the executing shard + `ahead` (2) rebuilt ones + one being received
    n = int((~model.token_mask(req.mask)).sum())
    shard_bytes = 2 * 2 * n * model.heads * model.head_dim * 4  # 2 layers × (K, V) × float32
    assert 0 < tl.peak_cache_bytes <= 4 * shard_bytes


def test_stream_with_reconstructor_and_executor_backends(setup):
    """The runtime's rebuild and execute stages are pluggable; the torch reconstructor and the
    shard-by-shard eager executor give the same image as the default path."""
    from sakura.runtime.executors import get_executor
    from sakura.runtime.reconstruct import get_reconstructor

    packs, tpl, model, req, compute, base = setup
    link = RangeClient(base)
    fid = file_id(tpl.id, "sakura")
    header = read_header(link, fid)
    default, _ = StreamedEdit(model, encoding_from_header("sakura", header), get_policy("sakura"), link, fid,
                              compute, 1e12).run(req)
    enc = encoding_from_header("sakura", header)
    enc.reconstructor = get_reconstructor("torch")
    plugged, tl = StreamedEdit(model, enc, get_policy("sakura"), link, fid, compute, 1e12,
                               executor=get_executor("eager", model)).run(req)
    assert len(tl.shards) == len(compute.shards) and tl.stall_s >= 0
    np.testing.assert_allclose(plugged.image, default.image, atol=1e-5)


def test_every_configuration_fits_the_budget_the_policy_computed(setup):
    packs, tpl, model, req, compute, base = setup
    scale = 0.02
    link = RangeClient(base, rate=RateSpec("5g", 40.0, scale))
    pol = get_policy("sakura")
    fid = file_id(tpl.id, "sakura")
    enc = encoding_from_header("sakura", read_header(link, fid))
    link.reset_link()
    initial = float(load_trace("5g").scaled(scale).rate_at(40.0)) * 1e6
    _, tl = StreamedEdit(model, enc, pol, link, fid, compute, initial).run(req)
    smallest = {u.index: min(lv.nbytes for lv in u.levels) for u in enc.units}
    for rec in tl.units:
        if rec.fits:
            assert rec.nbytes <= rec.budget_bytes
        else:  # nothing fits: the smallest stored configuration, never a skipped shard
            assert rec.budget_bytes < smallest[rec.unit] == rec.nbytes
    assert len({u.level for u in tl.units}) > 1  # it adapts


@pytest.mark.parametrize("system,scale", [("fp16", 0.05), ("intq", 0.02)])
def test_simulated_clock_agrees_with_real_clock(setup, system, scale):
    """Same trace segment, same policy: simulated latency within 15% of the real run's. The sim
    replays the compute the real run measured, so what is checked is the link and pipeline model."""
    packs, tpl, model, req, compute, base = setup
    trace, start = "5g", 120.0
    pol = get_policy(system)
    fid = file_id(tpl.id, pol.encoding)
    link = RangeClient(base, rate=RateSpec(trace, start, scale))
    enc = encoding_from_header(pol.encoding, read_header(link, fid))
    link.reset_link()
    initial = float(load_trace(trace).scaled(scale).rate_at(start)) * 1e6
    _, real = StreamedEdit(model, enc, pol, link, fid, compute, initial).run(req)
    raw = (packs / f"{fid}.pack").read_bytes()
    replay = ComputeProfile.from_timeline(real)
    sim, _ = simulate(enc, get_policy(system), replay, LinkModel(load_trace(trace).scaled(scale), start),
                      lambda ranges: [raw[o:o + n] for o, n in ranges], keep=False, predicted=compute)
    assert [u.level for u in sim.units] == [u.level for u in real.units]
    assert abs(sim.latency_s - real.latency_s) / real.latency_s < 0.15


def test_truncated_stream_fails_cleanly(setup):
    """A link that delivers garbage raises a one-line StreamError; the edit never hangs."""
    packs, tpl, model, req, compute, base = setup
    link = RangeClient(base)
    fid = file_id(tpl.id, "sakura")
    enc = encoding_from_header("sakura", read_header(link, fid))

    class Corrupting:
        def fetch_timed(self, file_id, ranges):
            tr = link.fetch_timed(file_id, ranges)
            tr.parts = [p[: len(p) // 2] for p in tr.parts]
            return tr

    with pytest.raises(StreamError, match="rebuilding unit 0 failed"):
        StreamedEdit(model, enc, get_policy("sakura"), Corrupting(), fid, compute, 1e12, timeout_s=20).run(req)
