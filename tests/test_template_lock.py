"""One builder per template and packs folder at a time: a folder's pack files are written in place, so a second
process building the same template (a bench that found it missing beside `sakura build`) would interleave its
writes and leave a pack whose ranges point at bytes that were never written."""

import subprocess
import sys
import threading
import time
from pathlib import Path

from sakura.offline.builder import template_lock

HOLDER = """
import sys, time
from pathlib import Path
from sakura.offline.builder import template_lock
folder = Path(sys.argv[1])
with template_lock(folder, "fs-astronaut"):
    (folder / "held").touch()
    while not (folder / "release").exists():
        time.sleep(0.02)
"""


def _wait_for(path: Path, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.02)


def test_a_second_process_waits_for_the_builder_of_the_same_template(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)])
    try:
        _wait_for(tmp_path / "held")
        acquired = threading.Event()

        def take() -> None:
            with template_lock(tmp_path, "fs-astronaut"):
                acquired.set()

        with template_lock(tmp_path, "vton-astronaut"):  # another template's lock is free
            pass
        waiter = threading.Thread(target=take, daemon=True)
        waiter.start()
        assert not acquired.wait(0.5)  # the other process still holds it
        (tmp_path / "release").touch()
        assert acquired.wait(60.0)
        assert holder.wait(60.0) == 0
    finally:
        holder.kill()


def _take(folder: Path, order: list[str]) -> None:
    with template_lock(folder, "mb-coffee"):
        order.append("other")


def test_the_lock_is_reentrant_in_its_thread_and_exclusive_between_threads(tmp_path):
    order = []
    with template_lock(tmp_path, "mb-coffee"):
        with template_lock(tmp_path, "mb-coffee"):  # build_template inside a caller that checked under the lock
            other = threading.Thread(target=_take, args=(tmp_path, order), daemon=True)
            other.start()
            other.join(0.3)
            order.append("nested")
        order.append("outer")
    other.join(30.0)
    assert order == ["nested", "outer", "other"]
