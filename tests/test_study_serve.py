"""``sakura study serve``'s two origins over real HTTP (uvicorn in a thread, real SQLite): the participant's
serves nothing but the study; the operator's needs the token; votes land once; a link resumes; errors are
clear 4xx answers."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections import Counter

import httpx
import pytest
from study_helpers import LEVELS, SYSTEMS, UNITS, synthetic_pool

from app.cli import start_app
from app.study import Design, StudyStore, plan_queue
from app.study_web import COOKIE, Limits, operator_app, participant_app

TOKEN = "operator-secret-token-for-tests"
# What the participant's pages are made of; anything else on that origin is a leak.
PARTICIPANT_ROUTES = {"/", "/consent", "/r/{token}", "/study", "/api/next", "/api/vote", "/img/{name}", "/healthz",
                      "/static"}


@pytest.fixture
def study(tmp_path):
    store = StudyStore(tmp_path / "study", Design(per_cell=1, controls=4), seed="tests")
    synthetic_pool(store)
    with start_app(participant_app(store, Limits(votes_per_minute=1000, min_vote_interval_s=0.0)), port=0) as who, \
            start_app(operator_app(store, TOKEN), port=0) as op:
        yield store, who.url.rstrip("/"), op.url.rstrip("/")


def _participant(base: str) -> httpx.Client:
    c = httpx.Client(base_url=base, follow_redirects=True, timeout=30)
    r = c.post("/consent")
    assert r.status_code == 200 and r.url.path == "/study"
    return c


def _paths(app) -> set[str]:
    return {getattr(r, "path", "") for r in app.routes}


def test_the_participants_origin_serves_only_the_study(study, tmp_path):
    store, who, op = study
    assert _paths(participant_app(store)) == PARTICIPANT_ROUTES
    operator_paths = _paths(operator_app(store, TOKEN)) - {"/static"}
    leaks = ["/report.png", "/report.csv", "/votes.csv", "/participants.csv", "/api/status", "/export", "/results",
             "/operator", "/docs", "/redoc", "/openapi.json", "/config", "/info", "/gradio_api/info",
             "/gradio_api/queue/join", "/queue/join", "/run/predict", "/api/predict", "/upload", "/file=study.sqlite",
             "/study.sqlite", "/img/study.sqlite", "/static/../study.sqlite", "/static/%2e%2e/app.js",
             "/sakura-static/app.js", "/r/", "/api/edit", "/edit"]
    assert operator_paths - {"/"} <= set(leaks)  # every operator route is probed below
    c = _participant(who)
    c.post("/api/vote", json={"ticket": c.get("/api/next").json()["ticket"], "similar": True}).raise_for_status()
    for path in leaks:
        for method in ("GET", "POST"):
            r = c.request(method, path)
            assert r.status_code in (404, 405), (method, path, r.status_code)
            assert "similar" not in r.text.lower() or "not found" in r.text.lower(), (path, r.text[:200])
            assert "Traceback" not in r.text
    # the same paths answer on the operator's origin (with its token): the probe list means something
    with httpx.Client(base_url=op, headers={"authorization": f"Bearer {TOKEN}"}) as o:
        for path in operator_paths:
            assert o.get(path).status_code == 200, path


def test_a_participant_gets_a_server_issued_id_votes_once_and_resumes_by_link(study):
    store, who, _ = study
    c = _participant(who)
    token = c.cookies[COOKIE]
    assert len(token) >= 32
    assert c.post("/consent").url.path == "/study" and c.cookies[COOKIE] == token  # consenting again keeps the id
    with httpx.Client(base_url=who, timeout=30) as fresh:
        assert "httponly" in fresh.post("/consent").headers["set-cookie"].lower()
    page = c.get("/study").text
    link = re.search(r'value="([^"]+/r/[^"]+)"', page).group(1)
    first = c.get("/api/next").json()
    assert first["state"] == "ask" and first["position"] == 1
    assert set(first) == {"state", "ticket", "left", "right", "position", "total", "prefetch"}
    for src in (first["left"], first["right"], *first["prefetch"]):
        img = c.get(src)
        assert img.status_code == 200 and img.headers["content-type"] == "image/png"
    assert c.post("/api/vote", json={"ticket": first["ticket"], "similar": False}).json() == {"ok": True}
    again = c.post("/api/vote", json={"ticket": first["ticket"], "similar": True})
    assert again.status_code == 409 and again.json()["error"] == "you have already answered this picture"

    # another browser with the link: the same participant, at the next pair; without it, a stranger
    with httpx.Client(follow_redirects=True, timeout=30) as b:
        assert b.get(link).url.path == "/study"
        nxt = b.get(f"{who}/api/next").json()
        assert nxt["position"] == 2 and nxt["ticket"] != first["ticket"]
        other = _participant(who)
        assert other.cookies[COOKIE] != token
        stolen = other.post("/api/vote", json={"ticket": nxt["ticket"], "similar": True})
        assert stolen.status_code == 404 and "not one of your pictures" in stolen.json()["error"]
        other.close()
    # a second session that opened the pair cannot answer it twice either
    rows = sqlite3.connect(store.db_path).execute("SELECT COUNT(*), SUM(similar) FROM votes").fetchone()
    assert rows == (1, 0)
    c.close()


def test_bad_requests_get_clear_4xx_answers(study):
    _, who, _ = study
    with httpx.Client(base_url=who, timeout=30) as anon:
        r = anon.get("/api/next")
        assert r.status_code == 401 and "no study session" in r.json()["error"]
        assert anon.post("/api/vote", json={"ticket": "x", "similar": True}).status_code == 401
        assert anon.get("/study").status_code == 303  # the page sends a newcomer to the consent text
        assert anon.get("/img/0123456789abcdef01234567.png").status_code == 401
        r = anon.get("/r/not-a-real-token")
        assert r.status_code == 404 and "resume link is not valid" in r.text and "<html" in r.text
    c = _participant(who)
    c.get("/api/next")
    for body in ({"ticket": "nope", "similar": True}, {"ticket": 3, "similar": "maybe"}, {}):
        r = c.post("/api/vote", json=body)
        assert r.status_code in (404, 422) and "error" in r.json() and "Traceback" not in r.text
    r = c.post("/api/vote", content=b"\xff not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "parsing the body" in r.json()["error"]
    assert c.get("/img/..%2fstudy.sqlite").status_code == 404
    c.close()


def test_votes_are_rate_limited_per_participant(tmp_path):
    store = StudyStore(tmp_path, Design(per_cell=1, controls=2), seed="t")
    synthetic_pool(store)
    with start_app(participant_app(store, Limits(votes_per_minute=3, min_vote_interval_s=0.0)), port=0) as srv:
        c, d = _participant(srv.url), _participant(srv.url)
        for _ in range(3):
            assert c.post("/api/vote", json={"ticket": c.get("/api/next").json()["ticket"], "similar": True}).is_success
        r = c.post("/api/vote", json={"ticket": c.get("/api/next").json()["ticket"], "similar": True})
        assert r.status_code == 429 and "too fast" in r.json()["error"]
        assert d.post("/api/vote", json={"ticket": d.get("/api/next").json()["ticket"], "similar": True}).is_success
        c.close()
        d.close()


def test_the_operator_origin_needs_the_token(study):
    store, who, op = study
    c = _participant(who)
    c.post("/api/vote", json={"ticket": c.get("/api/next").json()["ticket"], "similar": True}).raise_for_status()
    with httpx.Client(base_url=op, timeout=30) as o:
        for path in ("/", "/report.png", "/votes.csv", "/api/status"):
            assert o.get(path).status_code == 403
            assert o.get(path, params={"token": "wrong"}).status_code == 403
        r = o.get("/", params={"token": TOKEN})
        assert r.status_code == 303 and "token" not in r.headers["location"]
        o.cookies = r.cookies
        home = o.get("/")
        assert home.status_code == 200 and "1 answers" in home.text and "/report.png" in home.text
        png = o.get("/report.png")
        assert png.content[:8] == b"\x89PNG\r\n\x1a\n"
        votes = o.get("/votes.csv").text
        assert "P0001" in votes and c.cookies[COOKIE] not in votes and len(votes.splitlines()) == 2
        status = o.get("/api/status").json()
        assert status["counts"]["participants"] == 1 and status["counts"]["votes"] == 1
    c.close()


def test_a_participant_finishes_and_the_page_says_so(study):
    store, who, _ = study
    c = _participant(who)
    n = 0
    while (d := c.get("/api/next").json())["state"] == "ask":
        c.post("/api/vote", json={"ticket": d["ticket"], "similar": True}).raise_for_status()
        n += 1
    assert d == {"state": "done", "answered": n, "total": n} and n == len(SYSTEMS) * LEVELS + 4
    c.close()


def test_before_the_pool_is_ready_the_page_waits(tmp_path):
    store = StudyStore(tmp_path, seed="t")
    with start_app(participant_app(store), port=0) as srv:
        c = _participant(srv.url)
        assert c.get("/api/next").json()["state"] == "preparing"
        synthetic_pool(store)  # pairs arrive while the participant waits: no restart
        assert c.get("/api/next").json()["state"] == "ask"
        c.close()


def test_queues_are_balanced_across_systems_budgets_templates_and_sides(tmp_path):
    store = StudyStore(tmp_path, seed="t")
    pool = synthetic_pool(store)
    design = Design(per_cell=2, controls=6)
    seen: Counter = Counter()
    for number in range(12):
        q = plan_queue(pool, number, design, "seed")
        tests = [c for c, _ in q if c.kind == "test"]
        assert Counter(c.system for c in tests) == {s: 2 * LEVELS for s in SYSTEMS}
        assert Counter(c.budget for c in tests) == {k: 2 * len(SYSTEMS) for k in range(LEVELS)}
        assert Counter(c.kind for c, _ in q if c.kind != "test") == {"identical": 3, "wrong": 3}
        assert abs(sum(left for _, left in q) - len(q) / 2) <= 0.5
        assert len({c.id for c, _ in q}) == len(q)
        assert all(a.unit != b.unit for (a, _), (b, _) in zip(q, q[1:]))
        assert {c.template_id for c in tests} == {t for t, _ in UNITS}
        seen.update((c.system, c.budget, c.unit) for c in tests)
    # over participants every unit meets every (system, budget) cell equally often
    assert set(seen.values()) == {12 * 2 // len(UNITS)}
    assert plan_queue(pool, 3, design, "seed") == plan_queue(pool, 3, design, "seed")
    assert [c.id for c, _ in plan_queue(pool, 3, design, "seed")] != [c.id for c, _ in plan_queue(pool, 4, design,
                                                                                                   "seed")]


def test_sakura_study_serve_starts_both_origins_and_stops_on_sigterm(tmp_path):
    """The real command: participants' origin and operator origin on their own ports, the token printed once."""
    code = "import sys; from sakura.cli import main; sys.argv[0] = 'sakura'; sys.exit(main())"
    (tmp_path / "packs").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", code, "study", "serve", "--port", "0", "--operator-port", "0",
                             "--packs", str(tmp_path / "packs"), "--templates", "fs-astronaut", "--no-build",
                             "--data", str(tmp_path / "study")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines: list[str] = []
        while not any(line.startswith("pool:") for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        who = re.search(r"participants: (http://\S+)", "".join(lines)).group(1).rstrip("/")
        op, token = re.search(r"operator \(keep private\): (http://\S+)\?token=(\S+)", "".join(lines)).groups()
        assert who.rsplit(":", 1)[1] != op.rstrip("/").rsplit(":", 1)[1]
        c = _participant(who)
        assert c.get("/api/next").json()["state"] == "preparing"  # no pack published yet
        assert c.get("/report.png").status_code == 404
        with httpx.Client(base_url=op.rstrip("/"), timeout=30) as o:
            assert o.get("/api/status").status_code == 403
            st = o.get("/api/status", headers={"authorization": f"Bearer {token}"}).json()
            assert st["counts"]["participants"] == 1 and st["pool"]["waiting"] == ["fs-astronaut"]
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0 and "stopping" in out
