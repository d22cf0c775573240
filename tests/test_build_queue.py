"""The background pack builds of the demo (sakura.offline.build_queue), with a fake, fast builder."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from sakura.formats import FORMATS, file_id
from sakura.net.stores import FolderStore
from sakura.offline.build_queue import PRICED_SUFFIX, STAGING_DIR_NAME, BuildQueue, pack_paths
from sakura.offline.publish import BuildSettings

TIMEOUT_S = 10.0


def templates(*ids: str) -> list:
    """Stand-ins with the manifest fields a build key reads."""
    return [SimpleNamespace(id=i, task="fs", image_spec=i, mask_spec=None, model="sakura-tiny", seed=0,
                            profile_requests=()) for i in ids]


class FakeBuilder:
    """Writes a small dummy file per format (and a build record) into out_dir, reporting stages."""

    def __init__(self, seconds: float = 0.05, fail: set[str] = frozenset(), gate: threading.Event | None = None):
        self.seconds, self.fail, self.gate = seconds, set(fail), gate
        self.built: list[str] = []
        self.out_dirs: list[Path] = []
        self.kw: list[dict] = []
        self.started = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, template, out_dir, *, progress, **kw):
        with self.lock:
            self.built.append(template.id)
            self.out_dirs.append(Path(out_dir))
            self.kw.append(kw)
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT_S)
        progress("capture")
        time.sleep(self.seconds)
        if template.id in self.fail:
            raise ValueError(f"no model for {template.id}\nsecond line of the traceback")
        for name in FORMATS:
            progress(name)
            (Path(out_dir) / f"{file_id(template.id, name)}.pack").write_bytes(b"x" * 16)
        (Path(out_dir) / f"{template.id}.build.json").write_text("{}")


def write_all_packs(packs_dir: Path, template_id: str) -> None:
    for path in pack_paths(packs_dir, template_id):
        path.write_bytes(b"done")


def test_builds_in_catalog_order_and_all_become_ready(tmp_path):
    build = FakeBuilder()
    queue = BuildQueue(templates("a", "b", "c"), tmp_path, build=build, measure=None).start()
    assert queue.wait(TIMEOUT_S)
    assert build.built == ["a", "b", "c"]
    assert all(queue.ready(i) and queue.status(i) == "ready" for i in "abc")
    summary = queue.summary()
    assert summary == {"ready": 3, "total": 3, "current": None, "stage": "", "pricing": False, "failed": {},
                       "done": True}
    assert (tmp_path / "a.build.json").exists()
    queue.stop()


def test_prioritize_moves_a_waiting_template_to_the_front(tmp_path):
    gate = threading.Event()
    build = FakeBuilder(seconds=0.01, gate=gate)
    queue = BuildQueue(templates("a", "b", "c", "d"), tmp_path, build=build, measure=None).start()
    assert build.started.wait(TIMEOUT_S)  # "a" is building, held at the gate: not interrupted
    queue.prioritize("d")
    queue.prioritize("a")  # building, not waiting: no effect
    queue.prioritize("unknown")
    assert queue.status("d") == "waiting"
    assert queue.status("a").startswith("building")
    gate.set()
    assert queue.wait(TIMEOUT_S)
    assert build.built == ["a", "d", "b", "c"]
    queue.stop()


def test_progress_becomes_the_stage(tmp_path):
    gate = threading.Event()

    def build(template, out_dir, *, progress, **settings):
        progress("importance")
        gate.wait(TIMEOUT_S)
        FakeBuilder(seconds=0)(template, out_dir, progress=lambda stage: None)

    queue = BuildQueue(templates("a"), tmp_path, build=build, measure=None).start()
    deadline = time.monotonic() + TIMEOUT_S
    while queue.status("a") != "building: importance" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert queue.status("a") == "building: importance"
    summary = queue.summary()
    assert (summary["current"], summary["stage"], summary["done"]) == ("a", "importance", False)
    gate.set()
    assert queue.wait(TIMEOUT_S) and queue.ready("a")
    queue.stop()


def test_a_failing_build_is_reported_and_the_rest_still_build(tmp_path):
    build = FakeBuilder(fail={"b"})
    queue = BuildQueue(templates("a", "b", "c"), tmp_path, build=build, measure=None).start()
    assert queue.wait(TIMEOUT_S)
    assert queue.ready("a") and queue.ready("c") and not queue.ready("b")
    assert queue.status("b") == "failed: ValueError: no model for b"
    summary = queue.summary()
    assert summary["failed"] == {"b": "ValueError: no model for b"}
    assert (summary["ready"], summary["done"]) == (2, True)
    assert queue._worker.is_alive() is False  # ended normally once the queue was empty
    assert not list(tmp_path.glob("b*"))  # nothing of the failed build was published
    queue.stop()


def test_a_build_missing_a_format_fails_instead_of_publishing(tmp_path):
    def build(template, out_dir, *, progress, **settings):
        (Path(out_dir) / f"{file_id(template.id, 'sakura')}.pack").write_bytes(b"only the main pack")

    queue = BuildQueue(templates("a"), tmp_path, build=build, measure=None).start()
    assert queue.wait(TIMEOUT_S)
    assert queue.status("a").startswith("failed: StoreError: the build of a wrote no")
    assert not (tmp_path / "a.pack").exists()


def test_templates_already_complete_are_ready_without_a_build(tmp_path):
    write_all_packs(tmp_path, "a")
    (tmp_path / f"{file_id('b', 'sakura')}.pack").write_bytes(b"half of an old build")  # incomplete: rebuilt
    build = FakeBuilder()
    queue = BuildQueue(templates("a", "b"), tmp_path, build=build, measure=None)
    assert queue.ready("a") and not queue.ready("b")
    queue.start()
    assert queue.status("a") == "ready"
    assert queue.wait(TIMEOUT_S)
    assert build.built == ["b"]
    assert queue.summary()["ready"] == 2


def test_nothing_to_build_is_done_at_once(tmp_path):
    write_all_packs(tmp_path, "a")
    build = FakeBuilder()
    queue = BuildQueue(templates("a"), tmp_path, build=build, measure=None).start()
    assert queue.wait(TIMEOUT_S)
    assert build.built == [] and queue.summary()["done"]


def test_builds_in_staging_and_publishes_the_main_pack_last(tmp_path, monkeypatch):
    import sakura.net.stores as stores  # the folder store publishes with os.replace

    published: list[str] = []
    seen_when_main_appeared: list[bool] = []
    real_replace = stores.os.replace

    def watching_replace(src, dst):
        dst = Path(dst)
        if dst.name == f"{file_id('a', 'sakura')}.pack":  # a reader looking now must find every other file
            seen_when_main_appeared.append(all(p.exists() for p in pack_paths(tmp_path, "a") if p != dst))
        published.append(dst.name)
        real_replace(src, dst)

    monkeypatch.setattr(stores.os, "replace", watching_replace)
    build = FakeBuilder()
    queue = BuildQueue(templates("a"), tmp_path, build=build, measure=None).start()
    assert queue.wait(TIMEOUT_S)
    assert build.out_dirs == [tmp_path / STAGING_DIR_NAME / "a"]
    # the main pack last of the packs, then the record naming the build key
    assert published[-2:] == ["a.pack", "a.build.json"] and len(published) == len(FORMATS) + 1
    assert seen_when_main_appeared == [True]
    assert not (tmp_path / STAGING_DIR_NAME / "a").exists()  # staging removed once published
    assert all(p.exists() for p in pack_paths(tmp_path, "a"))


def test_stale_staging_is_replaced_by_a_fresh_folder(tmp_path):
    stale = tmp_path / STAGING_DIR_NAME / "a"
    stale.mkdir(parents=True)
    (stale / "leftover.pack").write_bytes(b"from a build that crashed")
    queue = BuildQueue(templates("a"), tmp_path, build=FakeBuilder(), measure=None).start()
    assert queue.wait(TIMEOUT_S)
    assert not (tmp_path / "leftover.pack").exists()


def test_stop_ends_the_thread_and_builds_nothing_more(tmp_path):
    gate = threading.Event()
    build = FakeBuilder(seconds=0.01, gate=gate)
    queue = BuildQueue(templates("a", "b", "c"), tmp_path, build=build, measure=None).start()
    assert build.started.wait(TIMEOUT_S)
    threading.Timer(0.05, gate.set).start()  # the build in progress finishes; nothing after it starts
    queue.stop()
    assert not queue._worker.is_alive()
    assert build.built == ["a"]
    assert queue.wait(0) and queue.summary()["done"]
    assert queue.status("b") == "waiting"


def test_start_twice_starts_one_worker(tmp_path):
    build = FakeBuilder()
    queue = BuildQueue(templates("a"), tmp_path, build=build, measure=None)
    assert queue.start() is queue and queue.start() is queue
    assert queue.wait(TIMEOUT_S)
    assert build.built == ["a"]


def test_wait_times_out_while_a_build_runs(tmp_path):
    gate = threading.Event()
    queue = BuildQueue(templates("a"), tmp_path, build=FakeBuilder(gate=gate), measure=None).start()
    assert queue.wait(0.01) is False
    gate.set()
    assert queue.wait(TIMEOUT_S)


class SteppedBuilder(FakeBuilder):
    """Reports progress many times (as a real build does once per pack shard), counting the reports."""

    def __init__(self, steps: int = 400):
        super().__init__()
        self.steps, self.reports = steps, 0

    def __call__(self, template, out_dir, *, progress, **kw):
        self.started.set()
        for i in range(self.steps):
            progress(f"shard {i}")
            self.reports += 1
            time.sleep(0.005)
        super().__call__(template, out_dir, progress=progress, **kw)


def test_a_paused_build_holds_at_its_next_report_and_resumes():
    """While a measured run holds paused() (nested here), the build makes no progress; after, it finishes."""
    import tempfile

    build = SteppedBuilder()
    with tempfile.TemporaryDirectory() as d:
        queue = BuildQueue(templates("a"), d, build=build, measure=None).start()
        assert build.started.wait(TIMEOUT_S)
        with queue.paused(), queue.paused():
            time.sleep(0.1)  # (the report in progress when the pause began may still land)
            held = build.reports
            time.sleep(0.5)
            assert build.reports == held < build.steps
            assert "paused while an edit runs" in queue.status("a")
        assert queue.wait(TIMEOUT_S) and queue.status("a") == "ready" and build.reports == build.steps


def test_stop_releases_a_paused_build():
    import tempfile

    build = SteppedBuilder()
    with tempfile.TemporaryDirectory() as d:
        queue = BuildQueue(templates("a", "b"), d, build=build, measure=None).start()
        assert build.started.wait(TIMEOUT_S)
        with queue.paused():
            time.sleep(0.1)
            queue.stop(timeout=TIMEOUT_S)  # does not wait for the pause to end
            assert not queue._worker.is_alive()


# ------------------------------------------------------------------------------ usable first, priced after


class FakeMeasurer:
    """Prices a kept build as the real measurement does: the SAKURA pack replaced by a new file (tmp + rename),
    reporting a stage first; logs what it priced into ``log`` (shared with a builder's order)."""

    def __init__(self, log: list, gate: threading.Event | None = None, fail: set[str] = frozenset()):
        self.log, self.gate, self.fail = log, gate, set(fail)
        self.started = threading.Event()

    def __call__(self, template, out_dir, model_path, progress):
        progress("output weights 1/2")
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT_S)
        if template.id in self.fail:
            raise ValueError(f"masked run failed for {template.id}")
        pack = Path(out_dir) / f"{file_id(template.id, 'sakura')}.pack"
        tmp = pack.with_name(pack.name + ".tmp")
        tmp.write_bytes(b"priced!!" * 2)
        tmp.replace(pack)
        self.log.append(("price", template.id))


class LoggingBuilder(FakeBuilder):
    def __init__(self, log: list, **kw):
        super().__init__(**kw)
        self.log = log

    def __call__(self, template, out_dir, *, progress, **kw):
        super().__call__(template, out_dir, progress=progress, **kw)
        self.log.append(("build", template.id))


def _sakura(root: Path, template_id: str) -> bytes:
    return (root / f"{file_id(template_id, 'sakura')}.pack").read_bytes()


def test_every_template_is_published_before_any_is_priced_then_each_is_published_priced(tmp_path):
    log: list = []
    tpls = templates("a", "b", "c")
    build = LoggingBuilder(log)
    queue = BuildQueue(tpls, tmp_path, build=build, measure=FakeMeasurer(log)).start()
    assert queue.wait(TIMEOUT_S)
    assert log == [("build", t) for t in "abc"] + [("price", t) for t in "abc"]
    assert all(kw.get("price_later") is True and kw["output_weights"] is False for kw in build.kw)
    store = FolderStore(tmp_path)
    for t in tpls:
        assert _sakura(tmp_path, t.id) == b"priced!!" * 2 and store.published_key(t.id) == BuildSettings().key(t)
    assert queue.status("a") == "ready" and not queue.summary()["failed"]
    assert not list((tmp_path / STAGING_DIR_NAME).iterdir())  # nothing kept once priced


def test_a_template_being_priced_is_ready_and_its_published_pack_untouched_until_then(tmp_path):
    log, gate = [], threading.Event()
    measure = FakeMeasurer(log, gate=gate)
    tpl = templates("a")
    queue = BuildQueue(tpl, tmp_path, build=LoggingBuilder(log), measure=measure).start()
    assert measure.started.wait(TIMEOUT_S)
    assert queue.ready("a") and queue.status("a") == "ready; pricing: output weights 1/2"
    s = queue.summary()
    assert s["pricing"] and s["current"] == "a" and s["ready"] == 1 and not s["done"]
    assert _sakura(tmp_path, "a") == b"x" * 16  # the kept copy is priced, not the published file
    assert FolderStore(tmp_path).published_key("a") == BuildSettings(output_weights=False).key(tpl[0])
    gate.set()
    assert queue.wait(TIMEOUT_S) and _sakura(tmp_path, "a") == b"priced!!" * 2


def test_the_picked_template_is_priced_next(tmp_path):
    log, gate = [], threading.Event()
    measure = FakeMeasurer(log, gate=gate)
    queue = BuildQueue(templates("a", "b", "c"), tmp_path, build=LoggingBuilder(log), measure=measure).start()
    assert measure.started.wait(TIMEOUT_S)
    queue.prioritize("c")
    gate.set()
    assert queue.wait(TIMEOUT_S)
    assert [t for kind, t in log if kind == "price"] == ["a", "c", "b"]


def test_a_failed_pricing_leaves_the_template_ready_on_its_own_errors(tmp_path):
    log: list = []
    tpl = templates("a", "b")
    queue = BuildQueue(tpl, tmp_path, build=LoggingBuilder(log), measure=FakeMeasurer(log, fail={"a"})).start()
    assert queue.wait(TIMEOUT_S)
    assert queue.status("a") == "ready; pricing failed: ValueError: masked run failed for a"
    assert queue.status("b") == "ready"
    store = FolderStore(tmp_path)
    assert store.published_key("a") == BuildSettings(output_weights=False).key(tpl[0])
    assert _sakura(tmp_path, "a") == b"x" * 16 and _sakura(tmp_path, "b") == b"priced!!" * 2
    assert not list((tmp_path / STAGING_DIR_NAME).iterdir())


def test_a_template_published_unpriced_is_priced_from_its_published_files_at_start(tmp_path):
    """A demo stopped while pricing: the next one prices what is published (no rebuild) and clears the stale
    kept files."""
    (staged := tmp_path / "staged").mkdir()
    for name in FORMATS:
        (staged / f"{file_id('a', name)}.pack").write_bytes(b"x" * 16)
    tpl = templates("a")
    FolderStore(tmp_path).publish("a", staged, BuildSettings(output_weights=False).key(tpl[0]))
    stale = tmp_path / STAGING_DIR_NAME / f"a{PRICED_SUFFIX}"
    stale.mkdir(parents=True)
    log: list = []
    build = LoggingBuilder(log)
    queue = BuildQueue(tpl, tmp_path, build=build, measure=FakeMeasurer(log)).start()
    assert queue.wait(TIMEOUT_S)
    assert log == [("price", "a")] and not stale.exists()
    assert FolderStore(tmp_path).published_key("a") == BuildSettings().key(tpl[0])
    assert _sakura(tmp_path, "a") == b"priced!!" * 2
    assert (tmp_path / f"{file_id('a', 'fp16')}.pack").read_bytes() == b"x" * 16  # the rest as published


def test_stop_drops_the_kept_files_of_templates_not_yet_priced(tmp_path):
    log, gate = [], threading.Event()
    measure = FakeMeasurer(log, gate=gate)
    queue = BuildQueue(templates("a", "b"), tmp_path, build=LoggingBuilder(log), measure=measure).start()
    assert measure.started.wait(TIMEOUT_S)
    queue.stop(timeout=0.1)  # a is being priced (held at the gate), b waits
    assert not (tmp_path / STAGING_DIR_NAME / f"b{PRICED_SUFFIX}").exists()
    assert queue.ready("b") and _sakura(tmp_path, "b") == b"x" * 16
    gate.set()
    queue._worker.join(TIMEOUT_S)
