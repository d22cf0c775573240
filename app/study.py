"""The user study's store and design: a pre-rendered candidate pool, server-issued participants, a balanced
queue per participant with control pairs, and votes — all in one SQLite file (WAL) beside the pool's PNGs.

A *candidate* is one pair shown side by side: the output on the exact FP16 cache (the reference) and either a
system's output at one byte budget (``kind="test"``) or a control: the reference itself (``"identical"``, the
right answer is *similar*), another template's picture (``"wrong"``) or the same request edited on a cache of
zeros (``"zeroed"``: the template intact, the edited region broken), where the right answer is *not similar*.
Candidates are made from the catalog's evaluation requests only (``app/study_pool.py``), never from uploads,
and their files carry neutral names (a hash of their bytes), so nothing a participant's browser receives names
the system.

A participant is a row with a sequence number (their public label ``P0007``) and the hash of a secret token
the server issued (the cookie; a link with the token resumes). Their queue is fixed the first time they ask
for a picture: per (system, budget level) cell the same number of candidates, the templates rotated by their
sequence number so that across participants every template meets every cell, plus control pairs; random
order (never the same template + request twice in a row when avoidable) and the reference on a random side
(as many left as right). A vote is committed at once and only once per item.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
import re
import secrets
import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

KINDS = ("test", "identical", "wrong", "zeroed")
CONTROL_ANSWER = {"identical": True, "wrong": False, "zeroed": False}  # the answer an attentive participant gives
NAME = re.compile(r"^[0-9a-f]{24}\.png$")

SCHEMA = """
CREATE TABLE IF NOT EXISTS candidates (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, workload TEXT NOT NULL, template_id TEXT NOT NULL,
  request INTEGER NOT NULL, system TEXT NOT NULL, budget INTEGER NOT NULL, bytes INTEGER NOT NULL,
  fp16_bytes INTEGER NOT NULL, config TEXT NOT NULL, psnr REAL, psnr_masked REAL, ssim REAL, ssim_masked REAL,
  image TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS participants (
  id INTEGER PRIMARY KEY AUTOINCREMENT, token_hash TEXT UNIQUE NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queue (
  participant INTEGER NOT NULL, pos INTEGER NOT NULL, ticket TEXT UNIQUE NOT NULL, candidate TEXT NOT NULL,
  reference_left INTEGER NOT NULL, shown_at TEXT, PRIMARY KEY (participant, pos));
CREATE TABLE IF NOT EXISTS votes (
  participant INTEGER NOT NULL, ticket TEXT NOT NULL, candidate TEXT NOT NULL,
  similar INTEGER NOT NULL CHECK (similar IN (0, 1)), reference_left INTEGER NOT NULL, shown_at TEXT,
  answered_at TEXT NOT NULL, seconds REAL, PRIMARY KEY (participant, candidate));
"""


class StudyError(ValueError):
    """A request the study refuses; ``status`` is the HTTP status the web layer answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Candidate:
    """One pair of the pool. ``budget``: the level within its system (0 = the smallest bytes), -1 for controls;
    ``system``: the system's registry name for a test pair, the control's kind otherwise."""
    id: str
    kind: str
    workload: str
    template_id: str
    request: int
    system: str
    budget: int
    bytes: int
    fp16_bytes: int
    config: str
    psnr: float | None
    psnr_masked: float | None
    ssim: float | None
    ssim_masked: float | None
    image: str
    reference: str
    created_at: str = ""

    @property
    def unit(self) -> tuple[str, int]:
        return self.template_id, self.request

    @property
    def fraction(self) -> float:
        """Bytes sent as a fraction of the FP16 cache."""
        return self.bytes / self.fp16_bytes if self.fp16_bytes else 0.0


@dataclass(frozen=True)
class Participant:
    number: int
    created_at: str

    @property
    def label(self) -> str:
        return f"P{self.number:04d}"


@dataclass(frozen=True)
class Shown:
    """What a participant's page shows next (no system, budget or metric: only neutral file names)."""
    ticket: str
    left: str
    right: str
    position: int  # 1-based
    total: int


@dataclass(frozen=True)
class Vote:
    participant: int
    ticket: str
    candidate: str
    similar: bool
    reference_left: bool
    shown_at: str | None
    answered_at: str
    seconds: float | None


@dataclass(frozen=True)
class Design:
    """``per_cell``: test pairs per (system, budget level) cell and participant; ``controls``: control pairs per
    participant (half identical, half wrong where both exist)."""
    per_cell: int = 2
    controls: int = 6


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (0..1); (0, 0) when n == 0."""
    if n == 0:
        return 0.0, 0.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # exact at the ends (rounding left 1 - 1e-16 above a rate of 1, which put a negative error bar on the plot)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def plan_queue(pool: list[Candidate], number: int, design: Design, seed: str) -> list[tuple[Candidate, bool]]:
    """A participant's queue: ``(candidate, reference on the left)`` in showing order.

    Per (system, budget) cell ``design.per_cell`` pairs, the units (template, request) taken in a rotation
    offset by the participant's number and the cell's index (each participant meets the templates spread
    over the cells; over participants each unit meets each cell equally often); controls rotated likewise."""
    rng = random.Random(hashlib.sha256(f"{seed}:{number}".encode()).hexdigest())
    tests: dict[tuple[str, int], list[Candidate]] = {}
    for c in sorted(pool, key=lambda c: (c.template_id, c.request, c.id)):
        if c.kind == "test":
            tests.setdefault((c.system, c.budget), []).append(c)
    chosen: list[Candidate] = []
    for i, cell in enumerate(sorted(tests)):
        units = tests[cell]
        m = min(design.per_cell, len(units))
        chosen += [units[(number * m + i + j) % len(units)] for j in range(m)]
    by_kind = {k: sorted((c for c in pool if c.kind == k), key=lambda c: (c.template_id, c.request, c.id))
               for k in CONTROL_ANSWER}
    # half the controls "similar" (identical), half "not similar", shared by the kinds of those in the pool
    differ = [k for k, same in CONTROL_ANSWER.items() if not same and by_kind[k]]
    n_same = design.controls // 2 if differ and by_kind["identical"] else design.controls if not differ else 0
    want = {"identical": n_same} | {k: (design.controls - n_same) // len(differ)
                                    + (i < (design.controls - n_same) % len(differ)) for i, k in enumerate(differ)}
    for kind, n in want.items():
        have = by_kind[kind]
        chosen += [have[(number * n + j) % len(have)] for j in range(min(n, len(have)))]
    rng.shuffle(chosen)
    order: list[Candidate] = []
    while chosen:  # never the same template + request twice in a row when avoidable: the unit most left first
        left = Counter(c.unit for c in chosen)
        ok = [i for i, c in enumerate(chosen) if not order or c.unit != order[-1].unit] or [0]
        pick = max(ok, key=lambda i: (left[chosen[i].unit], -i))
        order.append(chosen.pop(pick))
    sides = [True] * (len(order) // 2) + [False] * (len(order) - len(order) // 2)
    rng.shuffle(sides)
    return list(zip(order, sides))


class StudyStore:
    """The study's folder: ``study.sqlite`` (WAL) and ``pool/`` (the candidates' PNGs, neutral names). Safe
    across threads and processes: each operation opens its own connection and commits at once."""

    def __init__(self, folder: str | Path, design: Design = Design(), seed: str | None = None):
        self.folder = Path(folder)
        self.pool_dir = self.folder / "pool"
        self.pool_dir.mkdir(parents=True, exist_ok=True)
        self.db_path = self.folder / "study.sqlite"
        self.design = design
        self._queue_lock = threading.Lock()
        self._local = threading.local()
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA + "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);")
            db.execute("INSERT OR IGNORE INTO meta VALUES ('seed', ?)", (seed or secrets.token_hex(8),))
            self.seed = db.execute("SELECT value FROM meta WHERE key='seed'").fetchone()[0]

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection (opened once: closing the last one checkpoints the WAL, which costs more than
        the query), in autocommit mode: every vote is on disk when the call returns."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=30000")
            self._local.db = db
        try:
            yield db
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    # -- the pool -----------------------------------------------------------------------------------------
    def add_image(self, png: bytes) -> str:
        """Store a PNG in the pool under a neutral name (a hash of its bytes); returns the name."""
        name = hashlib.sha256(self.seed.encode() + png).hexdigest()[:24] + ".png"
        path = self.pool_dir / name
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(png)
            tmp.replace(path)  # a reader never sees half a file
        return name

    def add_candidates(self, cands: list[Candidate]) -> int:
        """Add pairs to the pool (their images already added); returns how many were new."""
        cols = [f.name for f in fields(Candidate)]
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            n = 0
            for c in cands:
                if c.kind not in KINDS:
                    raise ValueError(f"unknown candidate kind {c.kind!r}")
                row = [getattr(c, k) for k in cols]
                row[cols.index("created_at")] = c.created_at or _now()
                n += db.execute(f"INSERT OR IGNORE INTO candidates ({','.join(cols)}) VALUES "
                                f"({','.join('?' * len(cols))})", row).rowcount
            db.execute("COMMIT")
        return n

    def import_pool(self, other: "StudyStore") -> int:
        """Copy another study's pool (pairs and their files) into this one: a fresh study over the same pictures
        (scripted participants, latency measurements) that leaves the other's votes alone."""
        cands = other.pool()
        for name in {n for c in cands for n in (c.image, c.reference)}:
            if not (self.pool_dir / name).is_file():
                (self.pool_dir / name).write_bytes((other.pool_dir / name).read_bytes())
        return self.add_candidates(cands)

    def pool(self) -> list[Candidate]:
        cols = [f.name for f in fields(Candidate)]
        with self._db() as db:
            rows = db.execute(f"SELECT {','.join(cols)} FROM candidates ORDER BY id").fetchall()
        return [Candidate(*r) for r in rows]

    def units(self) -> set[tuple[str, int]]:
        """The (template, request) pairs whose candidates are in the pool."""
        with self._db() as db:
            return {(t, int(r)) for t, r in db.execute("SELECT DISTINCT template_id, request FROM candidates")}

    def ready(self) -> bool:
        """Something to ask: test pairs and at least one control kind."""
        kinds = {c.kind for c in self.pool()}
        return "test" in kinds and bool(kinds & set(CONTROL_ANSWER))

    def image_path(self, name: str) -> Path | None:
        """A pool file by name, or None (bad name, or not there)."""
        if not NAME.match(name or ""):
            return None
        p = self.pool_dir / name
        return p if p.is_file() else None

    # -- participants ---------------------------------------------------------------------------------------
    def new_participant(self) -> tuple[Participant, str]:
        """A participant and their secret token (shown once: the cookie and the resume link carry it)."""
        token = secrets.token_urlsafe(24)
        now = _now()
        with self._db() as db:
            cur = db.execute("INSERT INTO participants (token_hash, created_at) VALUES (?, ?)", (_hash(token), now))
            return Participant(int(cur.lastrowid), now), token

    def participant(self, token: str | None) -> Participant | None:
        if not token or len(token) > 128:
            return None
        with self._db() as db:
            row = db.execute("SELECT id, created_at FROM participants WHERE token_hash=?", (_hash(token),)).fetchone()
        return Participant(int(row[0]), row[1]) if row else None

    # -- the queue --------------------------------------------------------------------------------------------
    def _queue_rows(self, db, number: int) -> list[tuple]:
        return db.execute("SELECT pos, ticket, candidate, reference_left, shown_at FROM queue WHERE participant=? "
                          "ORDER BY pos", (number,)).fetchall()

    def queue(self, who: Participant) -> list[tuple]:
        """The participant's queue rows ``(pos, ticket, candidate id, reference_left, shown_at)``, made from the
        pool the first time it is ready (empty until then)."""
        with self._db() as db:
            rows = self._queue_rows(db, who.number)
        if rows or not self.ready():
            return rows
        plan = plan_queue(self.pool(), who.number - 1, self.design, self.seed)
        with self._queue_lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            if not self._queue_rows(db, who.number):
                db.executemany("INSERT INTO queue VALUES (?, ?, ?, ?, ?, NULL)",
                               [(who.number, i, secrets.token_urlsafe(9), c.id, int(left))
                                for i, (c, left) in enumerate(plan)])
            db.execute("COMMIT")
            return self._queue_rows(db, who.number)

    def next_pair(self, who: Participant) -> tuple[Shown | None, int, int]:
        """(the next unanswered pair or None, answered so far, queue length); marks it shown."""
        rows = self.queue(who)
        with self._db() as db:
            done = {c for (c,) in db.execute("SELECT candidate FROM votes WHERE participant=?", (who.number,))}
            for pos, ticket, cid, left, shown in rows:
                if cid in done:
                    continue
                image, reference = db.execute("SELECT image, reference FROM candidates WHERE id=?", (cid,)).fetchone()
                if shown is None:
                    db.execute("UPDATE queue SET shown_at=? WHERE ticket=? AND shown_at IS NULL", (_now(), ticket))
                a, b = (reference, image) if left else (image, reference)
                return Shown(ticket, a, b, len(done) + 1, len(rows)), len(done), len(rows)
        return None, len(rows), len(rows)

    def upcoming(self, who: Participant, n: int = 2) -> list[str]:
        """Image names of the next ``n`` unanswered pairs after the current one (for the page to prefetch)."""
        with self._db() as db:
            rows = db.execute("SELECT c.image, c.reference FROM queue q JOIN candidates c ON c.id=q.candidate "
                              "LEFT JOIN votes v ON v.participant=q.participant AND v.candidate=q.candidate "
                              "WHERE q.participant=? AND v.candidate IS NULL ORDER BY q.pos LIMIT ? OFFSET 1",
                              (who.number, n)).fetchall()
        return [name for row in rows for name in row]

    def vote(self, who: Participant, ticket: str, similar: bool) -> Vote:
        """Record one answer, committed at once. Unknown ticket (not this participant's): 404; a pair not shown
        yet: 409; a second answer: 409."""
        with self._db() as db:
            row = db.execute("SELECT candidate, reference_left, shown_at FROM queue WHERE participant=? AND ticket=?",
                             (who.number, str(ticket))).fetchone()
            if row is None:
                raise StudyError("unknown item: it is not one of your pictures", 404)
            cid, left, shown_at = row
            if shown_at is None:
                raise StudyError("this picture has not been shown to you yet", 409)
            now = _now()
            secs = (datetime.fromisoformat(now) - datetime.fromisoformat(shown_at)).total_seconds()
            cur = db.execute("INSERT OR IGNORE INTO votes VALUES (?,?,?,?,?,?,?,?)",
                             (who.number, ticket, cid, int(bool(similar)), left, shown_at, now, secs))
            if cur.rowcount != 1:
                raise StudyError("you have already answered this picture", 409)
        return Vote(who.number, ticket, cid, bool(similar), bool(left), shown_at, now, secs)

    def candidate_of(self, ticket: str) -> Candidate | None:
        """The pair behind a ticket (operator side: scripted participants, analysis)."""
        cols = [f.name for f in fields(Candidate)]
        with self._db() as db:
            row = db.execute(f"SELECT {','.join('c.' + k for k in cols)} FROM queue q JOIN candidates c "
                             "ON c.id=q.candidate WHERE q.ticket=?", (ticket,)).fetchone()
        return Candidate(*row) if row else None

    # -- results (operator side) --------------------------------------------------------------------------------
    def votes(self) -> list[Vote]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM votes ORDER BY answered_at").fetchall()
        return [Vote(int(r[0]), r[1], r[2], bool(r[3]), bool(r[4]), r[5], r[6], r[7]) for r in rows]

    def counts(self) -> dict:
        with self._db() as db:
            one = lambda q: int(db.execute(q).fetchone()[0])  # noqa: E731
            return {"candidates": one("SELECT COUNT(*) FROM candidates WHERE kind='test'"),
                    "controls": one("SELECT COUNT(*) FROM candidates WHERE kind!='test'"),
                    "units": one("SELECT COUNT(*) FROM (SELECT DISTINCT template_id, request FROM candidates)"),
                    "participants": one("SELECT COUNT(*) FROM participants"),
                    "votes": one("SELECT COUNT(*) FROM votes")}
