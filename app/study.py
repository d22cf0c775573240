"""The user study: a blind, balanced, resumable queue per participant; votes in SQLite (WAL).

Participants see the FP16-reference output and one candidate (a system's output for the same
template and request) and answer *similar* / *not similar*. Every vote is committed the moment it
is cast, so closing the browser loses nothing already answered; the same participant id resumes
the same queue where it stopped. The results table is the paper's Table 3 analog: % similar per
system per workload, with counts and Wilson 95 % intervals.

Candidates are generated through the device (``generate`` callback, the bridge in the app) ahead
of time or lazily, and cached under ``study_dir/candidates`` with neutral file names (a hash), so
nothing a participant's browser receives names the system.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import math
import random
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from device_bridge import SYSTEMS

WORKLOAD_NAMES = {"fs": "FS", "vton": "VTON", "mb": "MB", "mb-sd": "MB-SD"}
PARTICIPANT = re.compile(r"^[\w.@+ -]{1,64}$")

SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
  participant TEXT NOT NULL, pos INTEGER NOT NULL, item TEXT NOT NULL,
  PRIMARY KEY (participant, pos));
CREATE TABLE IF NOT EXISTS votes (
  participant TEXT NOT NULL, item TEXT NOT NULL, workload TEXT NOT NULL, template_id TEXT NOT NULL,
  request INTEGER NOT NULL, system TEXT NOT NULL, similar INTEGER NOT NULL CHECK (similar IN (0, 1)),
  shown_at TEXT, answered_at TEXT NOT NULL, seconds REAL,
  PRIMARY KEY (participant, item));
CREATE TABLE IF NOT EXISTS candidates (
  item TEXT PRIMARY KEY, file TEXT NOT NULL, reference_file TEXT NOT NULL, psnr REAL, ssim REAL,
  latency_s REAL, bytes INTEGER, created_at TEXT NOT NULL);
"""


class StudyError(ValueError):
    """Something the participant can fix (bad id, …); the message is one line for the page."""


@dataclass(frozen=True)
class Item:
    workload: str
    template_id: str
    request: int
    system: str

    @property
    def key(self) -> str:
        return f"{self.workload}|{self.template_id}|{self.request}|{self.system}"

    @property
    def pair(self) -> tuple[str, int]:
        return self.template_id, self.request

    @classmethod
    def parse(cls, key: str) -> "Item":
        w, t, r, s = key.split("|")
        return cls(w, t, int(r), s)


@dataclass(frozen=True)
class Candidate:
    item: Item
    image: Path
    reference: Path


def plan_items(workloads: dict[str, list[tuple[str, list[int]]]], systems: Iterable[str]) -> list[Item]:
    """Every (workload, template, request, system) of the study, in a fixed order."""
    systems = list(systems)
    return [Item(w, t, r, s) for w, tpls in workloads.items() for t, reqs in tpls for r in reqs for s in systems]


def balanced_order(items: list[Item], seed: str) -> list[Item]:
    """A random order (deterministic per seed) that avoids showing the same template+request twice in a
    row whenever possible, so a participant does not compare systems side by side from memory."""
    rng = random.Random(hashlib.sha256(seed.encode()).hexdigest())
    left = list(items)
    rng.shuffle(left)
    out: list[Item] = []
    while left:
        pick = next((i for i, it in enumerate(left) if not out or it.pair != out[-1].pair), 0)
        out.append(left.pop(pick))
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (0..1); (0, 0) when n == 0."""
    if n == 0:
        return 0.0, 0.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class StudyStore:
    """The study's folder: ``study.sqlite`` (WAL) and ``candidates/``. Safe across threads and
    processes: each operation opens its own connection and commits at once."""

    def __init__(self, folder: str | Path, items: list[Item], seed: str = "sakura-study"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "candidates").mkdir(exist_ok=True)
        self.db_path = self.folder / "study.sqlite"
        self.items = list(items)
        self.by_key = {it.key: it for it in self.items}
        self.seed = seed
        self._gen_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    @contextlib.contextmanager
    def _db(self):
        db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)  # autocommit: every vote lands
        try:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=30000")
            yield db
        finally:
            db.close()

    # -- participants ------------------------------------------------------------------------------
    @staticmethod
    def check_participant(pid: str | None) -> str:
        pid = (pid or "").strip()
        if not pid:
            raise StudyError("Please enter a participant id (any name or code you will remember).")
        if not PARTICIPANT.match(pid):
            raise StudyError("A participant id is 1–64 letters, digits, spaces or . _ - @ +")
        return pid

    def queue(self, pid: str) -> list[Item]:
        """The participant's queue, created on first use and stored, so resuming gives the same order."""
        pid = self.check_participant(pid)
        with self._db() as db:
            rows = db.execute("SELECT item FROM queue WHERE participant=? ORDER BY pos", (pid,)).fetchall()
            if not rows:
                order = balanced_order(self.items, f"{self.seed}:{pid}")
                db.execute("BEGIN IMMEDIATE")
                if not db.execute("SELECT 1 FROM queue WHERE participant=? LIMIT 1", (pid,)).fetchone():
                    db.executemany(
                        "INSERT INTO queue VALUES (?, ?, ?)", [(pid, i, it.key) for i, it in enumerate(order)]
                    )
                db.execute("COMMIT")
                rows = db.execute("SELECT item FROM queue WHERE participant=? ORDER BY pos", (pid,)).fetchall()
        return [self.by_key[k] for (k,) in rows if k in self.by_key]

    def answered(self, pid: str) -> set[str]:
        with self._db() as db:
            return {k for (k,) in db.execute("SELECT item FROM votes WHERE participant=?", (pid,))}

    def next_item(self, pid: str) -> tuple[Item | None, int, int]:
        """(next unanswered item or None, answered so far, queue length)."""
        q = self.queue(pid)
        done = self.answered(pid)
        for it in q:
            if it.key not in done:
                return it, sum(1 for x in q if x.key in done), len(q)
        return None, len(q), len(q)

    def vote(self, pid: str, item_key: str, similar: bool, shown_at: str | None = None,
             seconds: float | None = None) -> bool:
        """Record one answer (committed immediately). A second answer to the same item is ignored:
        returns False then."""
        pid = self.check_participant(pid)
        it = self.by_key.get(item_key)
        if it is None:
            raise StudyError("That question is not part of this study any more; please reload the page.")
        with self._db() as db:
            cur = db.execute("INSERT OR IGNORE INTO votes VALUES (?,?,?,?,?,?,?,?,?,?)",
                             (pid, it.key, it.workload, it.template_id, it.request, it.system, int(bool(similar)),
                              shown_at, _now(), seconds))
            return cur.rowcount == 1

    # -- candidates ---------------------------------------------------------------------------------
    def _file(self, name: str) -> Path:
        return self.folder / "candidates" / (hashlib.sha256(f"{self.seed}:{name}".encode()).hexdigest()[:20] + ".png")

    def candidate(self, item: Item) -> Candidate | None:
        with self._db() as db:
            row = db.execute("SELECT file, reference_file FROM candidates WHERE item=?", (item.key,)).fetchone()
        if row and (self.folder / row[0]).is_file() and (self.folder / row[1]).is_file():
            return Candidate(item, self.folder / row[0], self.folder / row[1])
        return None

    def ensure_candidate(self, item: Item, generate: Callable[[Item], dict]) -> Candidate:
        """The cached candidate, or generate it now. ``generate(item)`` returns ``{"image": PNG bytes,
        "reference": PNG bytes, "psnr", "ssim", "latency_s", "bytes"}``."""
        with self._locks_lock:
            lock = self._gen_locks.setdefault(item.key, threading.Lock())
        with lock:
            have = self.candidate(item)
            if have:
                return have
            out = generate(item)
            img, ref = self._file(item.key), self._file(f"ref:{item.template_id}:{item.request}")
            img.write_bytes(out["image"])
            if not ref.is_file():
                ref.write_bytes(out["reference"])
            rel = lambda p: str(p.relative_to(self.folder))  # noqa: E731
            with self._db() as db:
                db.execute("INSERT OR REPLACE INTO candidates VALUES (?,?,?,?,?,?,?,?)",
                           (item.key, rel(img), rel(ref), out.get("psnr"), out.get("ssim"), out.get("latency_s"),
                            out.get("bytes"), _now()))
            return Candidate(item, img, ref)

    def missing_candidates(self) -> list[Item]:
        return [it for it in self.items if self.candidate(it) is None]

    # -- results --------------------------------------------------------------------------------------
    def votes(self) -> list[dict]:
        with self._db() as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute("SELECT * FROM votes ORDER BY answered_at")]

    def table(self) -> list[dict]:
        """Per system and workload (plus 'all'): n, similar, pct and Wilson 95 % CI."""
        counts: dict[tuple[str, str], list[int]] = {}
        with self._db() as db:
            for system, workload, similar, n in db.execute(
                    "SELECT system, workload, SUM(similar), COUNT(*) FROM votes GROUP BY system, workload"):
                counts[(system, workload)] = [int(similar), int(n)]
        systems = list(dict.fromkeys([it.system for it in self.items] + [s for s, _ in counts]))
        workloads = list(dict.fromkeys([it.workload for it in self.items] + [w for _, w in counts]))
        rows = []
        for s in systems:
            tot = [0, 0]
            for w in workloads + ["all"]:
                k, n = tot if w == "all" else counts.get((s, w), [0, 0])
                if w != "all":
                    tot[0] += k
                    tot[1] += n
                lo, hi = wilson(k, n)
                rows.append({"system": s, "workload": w, "similar": k, "n": n,
                             "pct": 100.0 * k / n if n else None, "ci_low": 100 * lo, "ci_high": 100 * hi})
        return rows

    def table_display(self) -> tuple[list[str], list[list[str]]]:
        """Table 3 layout: one row per system, one column per workload; cells 'pct% (k/n) [lo–hi]'."""
        rows = self.table()
        workloads = list(dict.fromkeys(r["workload"] for r in rows))
        header = ["system"] + [WORKLOAD_NAMES.get(w, w) if w != "all" else "all workloads" for w in workloads]
        body = []
        for s in dict.fromkeys(r["system"] for r in rows):
            line = [(SYSTEMS[s].label if s in SYSTEMS else s)]
            for w in workloads:
                r = next(x for x in rows if x["system"] == s and x["workload"] == w)
                line.append("—" if not r["n"] else
                            f"{r['pct']:.1f}% ({r['similar']}/{r['n']}) [{r['ci_low']:.0f}–{r['ci_high']:.0f}]")
            body.append(line)
        return header, body

    def export_csv(self, out_dir: str | Path | None = None) -> Path:
        """Two CSVs in one file's worth of text: the summary table, then every vote."""
        out = Path(out_dir or self.folder / "exports")
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"study-{time.strftime('%Y%m%d-%H%M%S')}.csv"
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["# summary: % judged similar to the FP16-cache reference, Wilson 95% CI"])
        w.writerow(["system", "workload", "similar", "n", "pct", "ci_low", "ci_high"])
        for r in self.table():
            w.writerow([r["system"], r["workload"], r["similar"], r["n"],
                        "" if r["pct"] is None else f"{r['pct']:.2f}", f"{r['ci_low']:.2f}", f"{r['ci_high']:.2f}"])
        w.writerow([])
        w.writerow(["# votes"])
        cols = ["participant", "item", "workload", "template_id", "request", "system", "similar", "shown_at",
                "answered_at", "seconds"]
        w.writerow(cols)
        for v in self.votes():
            w.writerow([v[c] for c in cols])
        path.write_text(buf.getvalue(), encoding="utf-8")
        return path
