"""Output weights (issue #32): per shard, the edit's masked MSE per unit of the pack's error, measured at build on
the template's profiling requests and stored in the pack's header, so errors of different shards compare; and every
level's own measured masked MSE, which then prices it on the device."""

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from sakura.cli import app
from sakura.editing import edit_request, model_for
from sakura.eval.regret import LOCAL_ERROR, FormatInputs, RebuildFit
from sakura.formats import FORMATS, PackFormatError
from sakura.formats.base import Level
from sakura.formats.container import ContainerFile
from sakura.formats.pack import FORMAT, SUPPORTED_VERSIONS
from sakura.offline.builder import capture_request
from sakura.offline.level_errors import file_reader
from sakura.offline.output_weights import (
    OutputWeights,
    anchor_levels,
    masked_mse,
    measure_output_weights,
    reserve_output_weights,
    store_output_weights,
)


def _encoding(path):
    fmt = FORMATS["sakura"]
    return fmt.encoding_cls(fmt.open(path))


def test_anchor_levels_are_the_lossy_levels_nearest_each_target_once():
    levels = [Level(f"l{i}", 10 * (i + 1), e) for i, e in enumerate((0.3, 0.05, 0.012, 0.0009, 0.0))]
    assert [lv.label for lv in anchor_levels(levels, (0.1, 0.01, 0.001, 1e-6))] == ["l1", "l2", "l3"]


def test_the_build_stores_a_weight_per_shard_and_the_local_error(fs_packs):
    packs, tpl = fs_packs
    enc = _encoding(packs / f"{FORMATS['sakura'].file_id(tpl.id)}.pack")
    weights = [u.weight for u in enc.units]
    assert len(weights) == len(enc.units) and all(w > 0 for w in weights)
    assert enc.output_weights() == weights and 0 < enc.local_output_mse() < 1
    assert all(u.weight == 1.0 for u in _encoding(packs / f"{FORMATS['sakura-v1'].file_id(tpl.id)}.pack").units)


def test_the_build_prices_every_level_by_its_measured_output_mse(fs_packs):
    """The table has a value per level of every shard; the device's level error is it over the shard's weight;
    the pack's own errors stay readable (what measuring again needs), and the two differ."""
    packs, tpl = fs_packs
    path = packs / f"{FORMATS['sakura'].file_id(tpl.id)}.pack"
    enc, raw = _encoding(path), FORMATS["sakura"].encoding_cls(FORMATS["sakura"].open(path), level_output_mse=False)
    table = enc.level_output_mse()
    assert [len(t) for t in table] == [len(u.levels) for u in enc.units]
    for unit, own, row in zip(enc.units, raw.units, table):
        assert [lv.label for lv in unit.levels] == [lv.label for lv in own.levels]
        assert [unit.weight * lv.error for lv in unit.levels] == pytest.approx(row, rel=1e-9, abs=1e-30)
        assert all(m == 0 for m, lv in zip(row, own.levels) if lv.error == 0)  # (the exact level is not run)
    assert raw.level_output_mse() == table and any(
        lv.error != pytest.approx(own_lv.error) for u, own in zip(enc.units, raw.units)
        for lv, own_lv in zip(u.levels, own.levels))


class _FirstUnit:
    """An encoding seen through its first fetch unit only (a measurement of every level, kept short)."""

    def __init__(self, encoding, first: int = 0):
        self._encoding, self._first = encoding, first

    @property
    def units(self):
        return self._encoding.units[self._first:self._first + 1]

    def __getattr__(self, name):
        return getattr(self._encoding, name)


def _measuring(fs_packs):
    """What a measurement reads: the pack (its own errors), the model, the exact cache, two profiling requests."""
    packs, tpl = fs_packs
    path = packs / f"{FORMATS['sakura'].file_id(tpl.id)}.pack"
    model = model_for(tpl, None)
    cache = model.capture(capture_request(tpl, model))
    exact = {key: cache.get(*key) for key in cache.k}
    requests = [edit_request(tpl, r, resolution=model.codec.resolution, ref_size=model.codec.ref_size)
                for r in tpl.profile_requests[:2]]
    enc = FORMATS["sakura"].encoding_cls(FORMATS["sakura"].open(path), level_output_mse=False)
    return path, enc, model, exact, requests


def test_a_levels_output_mse_is_its_masked_runs_with_that_level_alone_mean_over_the_requests(fs_packs):
    path, enc, model, exact, requests = _measuring(fs_packs)
    measured = measure_output_weights(model, requests, exact, _FirstUnit(enc), file_reader(path))
    unit, (row,) = enc.units[0], measured.level_mse
    assert len(row) == len(unit.levels) and len(measured.weights) == 1
    lossy = [k for k, lv in enumerate(unit.levels) if lv.error > 0]
    k = lossy[len(lossy) // 2]
    level = unit.levels[k]
    kv = {**exact, **enc.fresh().decode(unit, level, file_reader(path)(enc.ranges(unit, level)))}
    own = [masked_mse(model.masked_edit(r, lambda s, layer: kv[(s, layer)]).image,
                      model.masked_edit(r, lambda s, layer: exact[(s, layer)]).image, r.mask) for r in requests]
    assert row[k] == pytest.approx(np.mean(own), rel=1e-9) and min(own) > 0 and own[0] != own[1]
    assert all(m == 0 for m, lv in zip(row, unit.levels) if lv.error == 0)


def test_a_run_that_changes_one_steps_kv_starts_at_that_step_and_is_the_same_run(fs_packs):
    """The measurement's runs start at the changed shard's step from the exact run's recorded state there: the
    output is the whole run's bit for bit, and no K/V of an earlier step is asked for."""
    path, enc, model, exact, requests = _measuring(fs_packs)
    g = enc.info.geometry
    unit = enc.units[2 * (g.num_layers // g.shard_size)]  # the first shard of step 2
    step = enc.info.shards[unit.index][0]
    level = next(lv for lv in unit.levels if lv.error > 0)
    kv = {**exact, **enc.fresh().decode(unit, level, file_reader(path)(enc.ranges(unit, level)))}
    states: dict = {}
    model.masked_edit(requests[0], lambda s, layer: exact[(s, layer)], trajectory=states)
    assert step == 2 and sorted(states) == list(range(model.num_steps))
    whole = model.masked_edit(requests[0], lambda s, layer: kv[(s, layer)])
    resumed = model.masked_edit(requests[0], lambda s, layer: kv[(s, layer)], resume=(step, states[step]))
    assert np.array_equal(resumed.image, whole.image)
    assert masked_mse(whole.image, model.masked_edit(requests[0], lambda s, layer: exact[(s, layer)]).image,
                      requests[0].mask) > 0
    assert {s for s, _, _ in resumed.extras["layer_times"]} == set(range(step, model.num_steps))


def test_a_weight_is_the_outputs_masked_mse_per_unit_of_error(fs_packs):
    """With one anchor per shard the weight is that anchor's measured ratio exactly; checked on the first shard
    by an edit of our own (the shard at the anchor level, every other shard exact)."""
    path, enc, model, exact, requests = _measuring(fs_packs)
    measured = measure_output_weights(model, requests, exact, enc, file_reader(path), targets=(0.01,), per_level=False,
                                      reuse=False)
    unit = enc.units[0]
    (level,) = anchor_levels(unit.levels, (0.01,))
    kv = {**exact, **enc.fresh().decode(unit, level, file_reader(path)(enc.ranges(unit, level)))}
    refs = [model.masked_edit(r, lambda s, layer: exact[(s, layer)]).image for r in requests]
    mse = np.mean([masked_mse(model.masked_edit(r, lambda s, layer: kv[(s, layer)]).image, ref, r.mask)
                   for r, ref in zip(requests, refs)])
    assert mse > 0 and measured.weights[0] == pytest.approx(mse / level.error, rel=1e-9)
    local = np.mean([masked_mse(model.full_edit(r).image, ref, r.mask) for r, ref in zip(requests, refs)])
    assert measured.local_mse == pytest.approx(local, rel=1e-9)


def test_a_reuse_is_measured_as_the_shard_on_the_previous_steps_kv_and_prices_the_reuse(fs_packs, tmp_path):
    """A shard of step 1: its reuse's output MSE is the masked runs with its layers on step 0's exact K/V; a pack
    that stores it prices the reuse fallback (``step_error``, on the levels' scale) by it; step 0 has none."""
    path, enc, model, exact, requests = _measuring(fs_packs)
    g = enc.info.geometry
    j = g.num_layers // g.shard_size + 1  # the second shard of step 1
    measured = measure_output_weights(model, requests, exact, _FirstUnit(enc, j), file_reader(path), targets=(0.01,),
                                      per_level=False)
    step, l0, l1 = enc.info.shards[j]
    kv = {**exact, **{(step, layer): exact[(step - 1, layer)] for layer in range(l0, l1)}}
    own = [masked_mse(model.masked_edit(r, lambda s, layer: kv[(s, layer)]).image,
                      model.masked_edit(r, lambda s, layer: exact[(s, layer)]).image, r.mask) for r in requests]
    assert measured.reuse_mse == pytest.approx((np.mean(own),), rel=1e-9) and min(own) > 0
    assert measure_output_weights(model, requests[:1], exact, _FirstUnit(enc), file_reader(path), targets=(0.01,),
                                  per_level=False).reuse_mse == (None,)
    copy = tmp_path / "t.pack"
    shutil.copy(path, copy)
    weights = [u.weight for u in _encoding(copy).units]
    reuse = tuple(None if enc.step_error(u) is None else 1e-5 * (u.index + 1) for u in enc.units)
    store_output_weights(copy, OutputWeights(tuple(weights), 0.1, (), reuse))
    priced = _encoding(copy)
    assert priced.reuse_output_mse() == pytest.approx(list(reuse))
    for u, raw in zip(priced.units, enc.units):
        want = None if reuse[u.index] is None else reuse[u.index] / weights[u.index]
        assert priced.step_error(u) == (None if want is None else pytest.approx(want, rel=1e-3))
    store_output_weights(copy, OutputWeights(tuple(weights), 0.1, (), (-1.0,) + reuse[1:]))
    with pytest.raises(PackFormatError, match="reuse_output_mse"):
        _encoding(copy)
    store_output_weights(copy, OutputWeights(tuple(weights), 0.1))  # measured again without it: the K/V distance
    assert [_encoding(copy).step_error(u) for u in enc.units] == [enc.step_error(u) for u in enc.units]


def test_storing_weights_keeps_every_chunk_and_a_bad_weight_is_a_format_error(fs_packs, tmp_path):
    packs, tpl = fs_packs
    path = tmp_path / "t.pack"
    shutil.copy(packs / f"{FORMATS['sakura'].file_id(tpl.id)}.pack", path)
    before = ContainerFile(path, FORMAT, SUPPORTED_VERSIONS)
    chunks = [before.read(*before.index.span(i)) for i in range(len(before.index))]
    n = len(_encoding(path).units)
    store_output_weights(path, OutputWeights(tuple(float(i + 1) for i in range(n)), 0.25))
    after = ContainerFile(path, FORMAT, SUPPORTED_VERSIONS)
    after.verify()
    assert [after.read(*after.index.span(i)) for i in range(len(after.index))] == chunks
    enc = _encoding(path)
    assert [u.weight for u in enc.units] == [float(i + 1) for i in range(n)] and enc.local_output_mse() == 0.25
    for bad in (OutputWeights((-1.0,) * n, 0.1), OutputWeights((1.0,), 0.1)):
        store_output_weights(path, bad)
        with pytest.raises(PackFormatError, match="output_weight"):
            _encoding(path)


def test_a_bad_level_table_is_a_format_error_and_weights_measured_again_drop_an_old_one(fs_packs, tmp_path):
    packs, tpl = fs_packs
    path = tmp_path / "t.pack"
    shutil.copy(packs / f"{FORMATS['sakura'].file_id(tpl.id)}.pack", path)
    raw = FORMATS["sakura"].encoding_cls(FORMATS["sakura"].open(path), level_output_mse=False)
    weights, sizes = tuple(u.weight for u in raw.units), [len(u.levels) for u in raw.units]
    good = tuple(tuple(float(k) for k in range(n)) for n in sizes)
    short = (good[0][:-1],) + good[1:]
    negative = ((-1.0,) + good[0][1:],) + good[1:]
    for bad in (short, negative, good[:-1]):
        store_output_weights(path, OutputWeights(weights, 0.1, bad))
        with pytest.raises(PackFormatError, match="level_output_mse"):
            _encoding(path)
    store_output_weights(path, OutputWeights(weights, 0.1, good))
    assert _encoding(path).level_output_mse() == [list(row) for row in good]
    store_output_weights(path, OutputWeights(weights, 0.1))  # measured again without levels: no stale table
    enc = _encoding(path)
    assert enc.level_output_mse() is None
    assert [lv.error for u in enc.units for lv in u.levels] == [lv.error for u in raw.units for lv in u.levels]


def test_the_planner_weighs_each_shard_and_shares_the_local_error_only_with_weights():
    fit = RebuildFit(0.0, 0.0, "bytes", 0)
    weighted = FormatInputs(None, fit, {}, {0: 2.0, 1: 0.5}, 0.3)
    assert (weighted.weight(0), weighted.weight(1), weighted.local_error(3)) == (2.0, 0.5, pytest.approx(0.1))
    plain = FormatInputs(None, fit, {})
    assert (plain.weight(0), plain.local_error(3)) == (1.0, LOCAL_ERROR)


def test_measuring_weights_without_a_pack_is_one_line(tmp_path):
    r = CliRunner().invoke(app, ["build", "--out", str(tmp_path), "--templates", "fs-astronaut",
                                 "--output-weights-only"])
    assert r.exit_code == 2 and "build first" in r.output and "Traceback" not in r.output


def test_build_runs_torch_on_the_threads_it_is_given(tmp_path):
    import torch

    before = torch.get_num_threads()
    try:  # one more than now, so the assertion cannot hold by chance
        CliRunner().invoke(app, ["build", "--out", str(tmp_path), "--templates", "fs-astronaut",
                                 "--output-weights-only", "--threads", str(before + 1)])
        assert torch.get_num_threads() == before + 1
    finally:
        torch.set_num_threads(before)


def test_a_pack_published_before_its_prices_is_priced_in_place_and_the_device_reads_them(fs_packs, tmp_path,
                                                                                       monkeypatch):
    """Published pending (room in the header), priced later by a new file: the header keeps its length (even for
    the longest values), every chunk its offset, so a device holding the first header still decodes the same K/V;
    its runtime reads the header again (not more often than it should) and prices by the table."""
    import torch

    import sakura.runtime.session as session
    from sakura.net.folder import FolderSource
    from sakura.runtime.session import DeviceRuntime, TemplateState

    packs, tpl = fs_packs
    fid = FORMATS["sakura"].file_id(tpl.id)
    path = tmp_path / f"{fid}.pack"
    priced = _encoding(packs / f"{fid}.pack")
    measured = OutputWeights(tuple(priced.output_weights()), priced.local_output_mse(),
                             tuple(map(tuple, priced.level_output_mse())))
    shutil.copy(packs / f"{fid}.pack", path)
    reserve_output_weights(path)
    pending = _encoding(path)
    assert pending.prices_pending and not priced.prices_pending
    assert pending.output_weights() is None and pending.level_output_mse() is None
    header_length, data = int.from_bytes(path.read_bytes()[:8], "little"), path.read_bytes()[8:]
    data = data[header_length:]

    source, reads = FolderSource(tmp_path), []
    read_header = source.header_bytes
    source.header_bytes = lambda file_id: reads.append(file_id) or read_header(file_id)
    runtime, state = DeviceRuntime(source), TemplateState(tpl, None, None, None)
    first = runtime.encoding(state, "sakura")
    unit = first.units[2]
    level = unit.levels[len(unit.levels) // 2]
    before = first.fresh().decode(unit, level, source.fetch(fid, first.ranges(unit, level)))

    longest = OutputWeights((9.999e-299,) * len(measured.weights), 9.999e-299,
                            tuple((9.999e-299,) * len(row) for row in measured.level_mse))
    for prices in (longest, measured):
        store_output_weights(path, prices)
        raw = path.read_bytes()
        assert int.from_bytes(raw[:8], "little") == header_length and raw[8 + header_length:] == data
    assert runtime.encoding(state, "sakura").prices_pending and len(reads) == 1  # read a moment ago: not again yet
    monkeypatch.setattr(session, "PENDING_PRICES_REREAD_S", 0.0)
    now = runtime.encoding(state, "sakura")
    assert not now.prices_pending and len(reads) == 2
    assert [lv.error for u in now.units for lv in u.levels] == [lv.error for u in priced.units for lv in u.levels]
    after = first.fresh().decode(unit, level, source.fetch(fid, first.ranges(unit, level)))  # the old header
    assert before.keys() == after.keys() and all(torch.equal(a, b) for key in before
                                                 for a, b in zip(before[key], after[key]))
    runtime.encoding(state, "sakura")
    assert len(reads) == 2  # priced: never read again
