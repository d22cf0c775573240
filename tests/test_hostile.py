"""Hostile stored-file headers: every one fails with one clear line and the reader's memory stays bounded.

(The template server's limits are in tests/test_server_limits.py, the CLI's in tests/test_cli_errors.py.)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sakura.formats import FORMATS, PackFormatError

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "fs-astronaut"
AS_LIMIT = 6 << 30  # address space of a child under test: a regression fails fast instead of eating 8 GB
MB = 1 << 20

# (format, dotted header key, value): each once made a reader allocate GBs or raise a traceback
HOSTILE = [
    ("sakura", "chunk_lengths", [[1, 10**9]]),
    ("sakura", "chunk_lengths", [[1, 10**11]]),
    ("sakura", "chunk_lengths", [[1, 1e9]]),
    ("sakura", "chunk_lengths", [[10**18, 1040]]),
    ("sakura", "data_length", 10**15),
    ("sakura", "geometry.num_steps", 10**7),
    ("sakura", "geometry.num_steps", 4000),  # within the limits, but not what the index holds
    ("sakura", "geometry.group", 1),
    ("sakura", "geometry.heads", 10**6),
    ("sakura", "geometry.n", 10**9),
    ("sakura", "geometry.rank", 2**40),
    ("sakura", "geometry", {"num_steps": "4"}),
    ("sakura", "shards", [[0, 0, 2]] * 16),
    ("sakura", "tradeoff", {"frontiers": [[["x"]]] * 16}),
    ("fp16", "chunk_lengths", [[1, 10**9]]),
    ("fp16", "geometry.num_steps", 10**7),
    ("fp16", "geometry.n", 10**12),
    ("intq", "geometry.num_steps", 10**7),
    ("intq", "bits", [2] * 10**5),
    ("intq", "bits", [2, 2, 3, 4]),
    ("cachegen", "chunk_lengths", [[1, 10**11]]),
]


def _file(folder: Path, fmt: str) -> Path:
    return folder / f"{FORMATS[fmt].file_id(TEMPLATE)}.pack"


def hostile_copy(src: Path, dst: Path, fmt: str, key: str, value) -> Path:
    """The template's stored files (links) with one header field of ``fmt`` replaced (a new file)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.glob(f"{TEMPLATE}*"):
        (dst / p.name).symlink_to(p)
    raw = _file(src, fmt).read_bytes()
    _file(dst, fmt).unlink()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    obj, *path = header, *key.split(".")
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    _file(dst, fmt).write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    return dst


@pytest.fixture(scope="module")
def packs(fs_packs) -> Path:
    return fs_packs[0]


@pytest.mark.parametrize("fmt,key,value", HOSTILE, ids=[f"{f}-{k}-{str(v)[:20]}" for f, k, v in HOSTILE])
def test_hostile_header_is_a_format_error(packs, tmp_path, fmt, key, value):
    folder = hostile_copy(packs, tmp_path, fmt, key, value)
    with pytest.raises(PackFormatError) as e:
        info = FORMATS[fmt].open(_file(folder, fmt))
        for s in range(info.num_shards):  # a frontier is read lazily: read them all
            getattr(info, "frontier", lambda s: None)(s)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300
    with pytest.raises(PackFormatError):  # a client parses the same bytes it got from a server
        raw = _file(folder, fmt).read_bytes()
        FORMATS[fmt].encoding_cls.from_header(raw[:8 + int.from_bytes(raw[:8], "little")])


@pytest.mark.parametrize("text", [b"[" * 100_000, b'{"format": "sakura-pack", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                                  b"\xff\xfe", b"null", b"[]"])
def test_malformed_header_json(text):
    text += b" " * (-len(text) % 8)
    with pytest.raises(PackFormatError):
        FORMATS["sakura"].info_cls.from_bytes(len(text).to_bytes(8, "little") + text)


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def test_hostile_headers_keep_reader_memory_bounded(packs, tmp_path):
    """Every hostile header parsed (file and client paths) in one fresh process: its peak RSS grows
    < 200 MB over what it had after the imports (it was 8.2 GB for chunk_lengths [[1, 1e9]])."""
    folders = [str(hostile_copy(packs, tmp_path / str(i), f, k, v)) for i, (f, k, v) in enumerate(HOSTILE)]
    script = textwrap.dedent(f"""
        import json, resource, sys
        from sakura.formats import FORMATS, encoding_from_header
        from sakura.formats.inspect import pack_summary
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for folder, fmt in json.loads(sys.argv[1]):
            path = folder + "/" + FORMATS[fmt].file_id({TEMPLATE!r}) + ".pack"
            for parse in (lambda: pack_summary(folder, {TEMPLATE!r}),
                          lambda: encoding_from_header(fmt, open(path, "rb").read(1 << 20))):
                try:
                    parse()
                except Exception as e:
                    assert type(e).__name__ in ("PackFormatError", "IndexError"), repr(e)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
    """)
    cases = json.dumps([[folder, fmt] for folder, (fmt, _, _) in zip(folders, HOSTILE)])
    out = subprocess.run([sys.executable, "-c", script, cases], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, preexec_fn=_limited)
    assert out.returncode == 0, out.stderr[-2000:]
    growth = int(out.stdout.split()[-1])
    print(f"peak RSS growth over {len(HOSTILE)} hostile headers: {growth / MB:.1f} MB")
    assert growth < 200 * MB


_CLI = ("import atexit, resource; atexit.register(lambda: print('peak-rss-kb', "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)); from sakura.cli import main; main()")


def run_clis(*runs: list[str], timeout: float = 300) -> list[tuple[int, str, int]]:
    """``sakura ARGS`` for each ARGS, each in its own child under an address-space limit, all at once (a
    child's peak RSS is its own; most of each run is the CLI's imports): (exit code, stderr, peak RSS bytes)."""
    procs = [subprocess.Popen([sys.executable, "-c", _CLI, *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, preexec_fn=_limited,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for args in runs]
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            peak = [ln.split()[1] for ln in stdout.splitlines() if ln.startswith("peak-rss-kb ")]
            results.append((proc.returncode, stderr, int(peak[-1]) * 1024 if peak else 0))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_pack_info_on_hostile_headers_is_one_line(packs, tmp_path):
    from typer.testing import CliRunner

    from sakura.cli import app

    for i, (fmt, key, value) in enumerate(HOSTILE):
        folder = hostile_copy(packs, tmp_path / str(i), fmt, key, value)
        r = CliRunner().invoke(app, ["pack-info", str(folder / TEMPLATE)])
        if fmt == "cachegen" or key == "tradeoff":
            continue  # read only for sizes by pack-info
        assert r.exit_code == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr[-1500:]


def test_pack_info_peak_memory_on_a_hostile_header(packs, tmp_path):
    """It took 8.2 GB for chunk_lengths [[1, 1e9]]; now no more than pack-info on the intact pack + 200 MB."""
    folder = hostile_copy(packs, tmp_path, *HOSTILE[0])
    (rc_ok, _, peak_ok), (rc, err, peak) = run_clis(["pack-info", str(packs / TEMPLATE)],
                                                    ["pack-info", str(folder / TEMPLATE)])
    print(
        f"pack-info peak RSS: intact {peak_ok / MB:.0f} MB, chunk_lengths [[1, 1e9]] {peak / MB:.0f} MB: {err.strip()}"
    )
    assert rc_ok == 0 and rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err[-1500:]
    assert 0 < peak < peak_ok + 200 * MB
