"""Pack bytes from several template server replicas (issue #30 D5): a dead source costs a retry and a switch,
never the bytes; a replica serving another version of a file is never mixed in. Real servers on free ports."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from sakura.net.byteranges import FetchError
from sakura.net.client import RangeClient
from sakura.net.failover import FailoverSource, SourcesUnavailable
from sakura.server import start_server

RANGES = [(100, 5000), (60_000, 12_345), (190_000, 9_999)]


def unpriced():
    """SAKURA's policy with a window so wide that every level fits: every unit's top level on every run (a
    rebuild-priced choice reads each run's measured decode times, and on a loaded machine the monitor reads
    a slower link than the trace: either could make two runs differ, which is not what these tests check)."""
    from sakura.online.policies import RULE_SETTINGS, get_policy

    # (the per-unit rule: its window is γ·(need − now); the plan would plan on R̂ however wide the window)
    return get_policy("sakura", price_rebuild=False, gamma=1e6, **RULE_SETTINGS)


def pack(seed: int) -> bytes:
    head = json.dumps({"format": "test", "version": seed}).encode()
    return struct.pack("<Q", len(head)) + head + np.random.default_rng(seed).bytes(200_000)


@pytest.fixture
def replicas(tmp_path):
    """Three servers: a and b hold the same pack, c another version of it."""
    servers = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        d = tmp_path / name
        d.mkdir()
        (d / "tpl.pack").write_bytes(pack(seed))
        servers[name] = start_server(d)
    yield servers
    for s in servers.values():
        s.stop()


def expected(seed: int) -> list[bytes]:
    data = pack(seed)
    return [data[o:o + n] for o, n in RANGES]


def test_a_dead_server_costs_a_retry_and_a_switch_and_the_same_bytes(replicas):
    a, b = replicas["a"], replicas["b"]
    with FailoverSource([RangeClient(a.url), RangeClient(b.url)], names=["a", "b"]) as src:
        assert src.header_bytes("tpl") == pack(1)[:8 + struct.unpack("<Q", pack(1)[:8])[0]]
        assert src.fetch("tpl", RANGES) == expected(1) and not src.events
        a.stop()  # mid-edit: the next request finds nobody on a's port
        assert src.fetch("tpl", RANGES) == expected(1)
        assert [(e.kind, e.source) for e in src.events] == [("retry", 0), ("switch", 1)]
        assert "ConnectError" in src.events[0].reason
        assert src.fetch("tpl", RANGES) == expected(1) and len(src.events) == 2  # it stays on b


def test_a_replica_with_another_version_of_the_file_is_skipped(replicas):
    a, b, c = replicas["a"], replicas["b"], replicas["c"]
    with FailoverSource([RangeClient(x.url) for x in (a, c, b)], names=["a", "c", "b"]) as src:
        src.header_bytes("tpl")
        a.stop()
        assert src.fetch("tpl", RANGES) == expected(1)  # c's bytes would have decoded to garbage
        assert [e.kind for e in src.events] == ["retry", "switch", "mismatch", "switch"]
        assert src.events[2].source == 1 and "another version" in src.events[2].reason


def test_no_source_answering_is_one_clear_error_and_a_wrong_request_is_not_retried(replicas):
    a, b = replicas["a"], replicas["b"]
    with FailoverSource([RangeClient(a.url), RangeClient(b.url)], names=["a", "b"]) as src:
        with pytest.raises(FetchError) as e:
            src.fetch("nope", [(0, 10)])
        assert e.value.status == 404 and not src.events  # an answer, not a dead source
        a.stop()
        b.stop()
        with pytest.raises(SourcesUnavailable) as e:
            src.fetch("tpl", RANGES)
        msg = str(e.value)
        assert e.value.status == 503 and "\n" not in msg and "a:" in msg and "b:" in msg, msg


def test_an_edit_survives_its_server_dying_when_a_replica_is_up(fs_packs):
    """Real clock, two server processes on the same packs: the first is killed after the edit's third request.
    The edit ends with no fallback and no dropped unit, at the levels of an unfaulted run (up to the few an
    early, noisy rate estimate may move on the real clock) and nearly its image; the timeline says what
    happened (a retry on the dead server, then a switch)."""
    import os
    import signal

    from sakura.catalog import load_catalog
    from sakura.formats import file_id
    from sakura.net.traces import load_trace
    from sakura.runtime.calibration import CalibrationStore
    from sakura.runtime.session import DeviceRuntime, Network

    packs, _ = fs_packs
    tpl = load_catalog().get("fs-astronaut")
    fast = Network(load_trace("fixed:2000"), "fixed:2000", 0.0, 1.0, "none")  # every unit at its top level
    with start_server(packs, process=True) as a, start_server(packs, process=True) as b:
        for srv in (a, b):  # a server's first range request per file is slow (lazy init): not the failover's cost
            with RangeClient(srv.url) as warm:
                for fmt in ("sakura", "fp16"):
                    warm.fetch(file_id(tpl.id, fmt), [(0, 8)])
        source = FailoverSource([RangeClient(a.url), RangeClient(b.url)], names=["a", "b"])
        runtime = DeviceRuntime(source, calibration=CalibrationStore(repeats=1))
        runs = {}
        for fault in (False, True):
            seen = []

            def on_event(ev, fault=fault, seen=seen):
                if ev.get("type") == "request":
                    seen.append(ev)
                    if fault and len(seen) == 3:
                        os.kill(a._proc.pid, signal.SIGKILL)

            session = runtime.session(tpl, "sakura", fast, on_event=on_event, timeout_s=60, policy=unpriced())
            req = session.request(catalog_request=tpl.eval_requests[0])
            runs[fault] = session.run(req)
        source.close()
    from sakura.quality import psnr

    clean, faulted = runs[False].timeline, runs[True].timeline
    assert not faulted.fallbacks and not any(u.dropped for u in faulted.units)
    moved = sum(a.level != b.level for a, b in zip(faulted.units, clean.units))
    assert len(faulted.units) == len(clean.units) and moved <= 3, [u.level for u in faulted.units]
    assert psnr(runs[True].image, runs[False].image) > 40
    kinds = [e["kind"] for e in faulted.extras["source_events"]]
    assert kinds == ["retry", "switch"] and "source_events" not in clean.extras, faulted.extras
    print(f"latency unfaulted {clean.latency_s:.3f} s, server killed mid-edit {faulted.latency_s:.3f} s; "
          f"events {faulted.extras['source_events']}")


def test_an_edit_whose_only_server_dies_ends_by_the_fallback_rule(fs_packs):
    """No replica: the server is killed after the edit's third request. The requests no source answers stay
    pending (a silent link), the fallback rule decides (reuse the previous step, or go local within its bound),
    and the edit ends with an image, not a failure; the timeline records the outage."""
    import os
    import signal

    from sakura.catalog import load_catalog
    from sakura.net.traces import load_trace
    from sakura.runtime.calibration import CalibrationStore
    from sakura.runtime.session import DeviceRuntime, Network

    packs, _ = fs_packs
    tpl = load_catalog().get("fs-astronaut")
    with start_server(packs, process=True) as a:
        client = RangeClient(a.url)
        runtime = DeviceRuntime(client, calibration=CalibrationStore(repeats=1))
        seen = []

        def on_event(ev):
            if ev.get("type") == "request":
                seen.append(ev)
                if len(seen) == 3:
                    os.kill(a._proc.pid, signal.SIGKILL)

        session = runtime.session(tpl, "sakura", Network(load_trace("fixed:2000"), "fixed:2000", 0.0, 1.0, "none"),
                                  on_event=on_event, timeout_s=60)
        req = session.request(catalog_request=tpl.eval_requests[0])
        outcome = session.run(req)
        client.close()
    tl = outcome.timeline
    kinds = {f["kind"] for f in tl.fallbacks}
    assert kinds and kinds <= {"reuse", "local", "recompute"}, tl.fallbacks
    (outage,) = tl.extras["source_outages"]
    # (refused, or cut off mid-answer when a request was on the wire as the server died)
    assert outage["back_s"] is None and ("Connect" in outage["why"] or "disconnected" in outage["why"]), outage
    assert outcome.image.shape == (256, 256, 3) and np.isfinite(outcome.image).all()
    bound = session.fallback_context().hard_s
    print(f"server died mid-edit, no replica: fallbacks {tl.fallbacks}; latency {tl.latency_s:.2f} s "
          f"(hard bound {bound:.2f} s, local generation {session.compute.local_full_s:.2f} s)")


def test_a_paced_request_no_source_answers_is_a_silent_link_until_the_server_is_back(replicas, tmp_path):
    """PacedLink: while nobody answers, the request is pending with nothing through (what the fallback rule
    reads as a silent link); it is sent again until the server is back, then its bytes come as booked."""

    from sakura.net.paced import PacedLink
    from sakura.net.traces import load_trace

    a = replicas["a"]
    port = a.port
    link = PacedLink(RangeClient(a.url), load_trace("fixed:100"), 0.0)
    assert link.receive(link.send("tpl", RANGES)).parts == expected(1)
    a.stop()
    pending = link.send("tpl", RANGES)  # the server is gone: no error, no bytes
    seen = link.progress(pending, need_bytes=5000)
    assert pending.transfer is None and seen.delivered == 0 and seen.recent_bytes == 0
    dropped = link.receive(link.send("tpl", RANGES), drop=_set())
    assert dropped.parts == [] and dropped.nbytes == 0  # a fallback replaced it: nothing to wait for
    back = start_server(tmp_path / "a", port=port)  # the same server, restarted
    try:
        assert link.receive(pending).parts == expected(1)
    finally:
        back.stop()
    (outage,) = link.outages
    assert outage["back_s"] is not None and outage["back_s"] > outage["down_s"] and "Connect" in outage["why"]


def _set():
    import threading

    ev = threading.Event()
    ev.set()
    return ev


def test_a_corrupted_chunk_is_fetched_again_from_the_next_replica(fs_packs, tmp_path):
    """One replica serves a pack with a damaged byte in a data chunk (its header is intact, so the two look
    alike): the rebuild's CRC check catches it, the bytes come again from the other replica, and the edit
    gives the same image as on the intact one alone."""
    import shutil

    from sakura.catalog import load_catalog
    from sakura.formats import file_id
    from sakura.net.traces import load_trace
    from sakura.runtime.calibration import CalibrationStore
    from sakura.runtime.session import DeviceRuntime, Network

    packs, _ = fs_packs
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(packs, good)
    shutil.copytree(packs, bad)
    # the first data chunk of the pack and of the FP16 file (a fast link's ladder reads the first shard's exact
    # rung from the FP16 file's own bytes): the first shard's units read one of them
    for fmt in ("sakura", "fp16"):
        victim = bad / f"{file_id('fs-astronaut', fmt)}.pack"
        raw = bytearray(victim.read_bytes())
        data_start = 8 + int.from_bytes(raw[:8], "little")
        raw[data_start + 10] ^= 0xFF
        victim.write_bytes(bytes(raw))
    tpl = load_catalog().get("fs-astronaut")
    fast = Network(load_trace("fixed:2000"), "fixed:2000", 0.0, 1.0, "none")
    images, events, levels = {}, {}, {}
    with start_server(bad) as b_srv, start_server(good) as g_srv:
        for name, urls in (("intact", [g_srv.url]), ("damaged first", [b_srv.url, g_srv.url])):
            source = FailoverSource([RangeClient(u) for u in urls])
            runtime = DeviceRuntime(source, calibration=CalibrationStore(repeats=1))
            session = runtime.session(tpl, "sakura", fast, timeout_s=60, policy=unpriced())
            outcome = session.run(session.request(catalog_request=tpl.eval_requests[0]))
            images[name], events[name] = outcome.image, outcome.timeline.extras.get("source_events", [])
            levels[name] = [u.level for u in outcome.timeline.units]
            source.close()
    if levels["damaged first"] == levels["intact"]:  # the same choices: the same bytes, so the same image
        np.testing.assert_array_equal(images["damaged first"], images["intact"])
    else:  # a busy machine's rate estimate moved a level or two: still the intact pack's bytes, nearly the same image
        mse = float(np.mean((images["damaged first"] - images["intact"]) ** 2))
        assert 10 * np.log10(1 / max(mse, 1e-20)) > 40, (levels, mse)
    assert not events["intact"]
    assert [e["kind"] for e in events["damaged first"]] == ["switch"], events
    assert "checksum" in events["damaged first"][0]["reason"]
