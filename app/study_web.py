"""``sakura study serve``'s two web apps: the participants' (only the study) and the operator's (results,
exports, the pool's progress), each its own FastAPI application on its own listener, plain HTML + JS.

Participants' origin: a consent page, the study page, the next pair, a vote, the pool's images, a resume
link — nothing else (no Gradio, no results, no export, no edit; FastAPI's docs are off). The server issues
each participant an unguessable token on consent (an HttpOnly cookie; ``/r/<token>`` resumes on any
browser); only its hash is stored. Each vote is accepted once per pair, for a pair that was shown, and at
most ``votes_per_minute`` per participant. Errors answer as one JSON line (``/api/…``) or a short page.

Operator's origin (127.0.0.1 by default): every route needs the token printed at start-up (``?token=`` once,
then a cookie, or ``Authorization: Bearer``).
"""

from __future__ import annotations

import html
import secrets
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from app.study import StudyError, StudyStore
from app.study_report import build_report, report_csv, report_png, votes_csv

STATIC = Path(__file__).resolve().parent.parent / "static"
COOKIE = "sakura_study"
OPERATOR_COOKIE = "sakura_study_operator"
CONSENT = """<p>This is a short study of picture quality. You will see pairs of pictures, side by side, and answer
for each pair whether the two look <b>similar</b> or <b>not similar</b>. There are no right answers: go with
your first impression. A session takes about five minutes.</p>
<p>We record only your answers and how long each took, under a random code this site gives you; no name, no
e-mail, no photo of yours. The pictures are generated from built-in examples. You can stop at any time; your
answers so far are kept, and the link you will be shown lets you continue later.</p>"""


@dataclass(frozen=True)
class Limits:
    votes_per_minute: int = 60  # per participant
    min_vote_interval_s: float = 0.3  # per participant: faster than a person can look at two pictures
    consents_per_minute: int = 60  # per client address (a lab behind one NAT arrives together)


class RateLimit:
    """At most ``per_minute`` events per key in any 60 s and none closer than ``min_interval`` seconds."""

    def __init__(self, per_minute: int, min_interval: float = 0.0):
        self.per_minute, self.min_interval = per_minute, min_interval
        self._events: dict[str, deque] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            q = self._events.setdefault(key, deque())
            while q and now - q[0] > 60:
                q.popleft()
            if len(q) >= self.per_minute or (q and now - q[-1] < self.min_interval):
                return False
            q.append(now)
            return True


class VoteIn(BaseModel):
    ticket: str
    similar: bool


def _error(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith("/api/") or "application/json" in request.headers.get("accept", ""):
        return JSONResponse({"error": message, "status": status}, status_code=status)
    return HTMLResponse(_page("Study", f"<div class='box warn'><p>{html.escape(message)}</p>"
                                       "<p><a href='/'>Back to the start</a></p></div>"), status_code=status)


def _handlers(api: FastAPI) -> None:
    @api.exception_handler(StudyError)
    async def study_error(request: Request, e: StudyError):
        return _error(request, e.status, str(e))

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        msg = {404: "not found", 405: "method not allowed"}.get(e.status_code, str(e.detail))
        return _error(request, e.status_code, msg if e.status_code in (404, 405) else str(e.detail))

    @api.exception_handler(RequestValidationError)
    async def bad_body(request: Request, e: RequestValidationError):
        return _error(request, 422, "malformed request: expected JSON {\"ticket\": string, \"similar\": true|false}")

    @api.exception_handler(Exception)
    async def crash(request: Request, e: Exception):  # never a traceback to the browser
        return _error(request, 500, "internal error; please try again")


def _page(title: str, body: str, script: str = "") -> str:
    js = f'<script src="/static/{script}" defer></script>' if script else ""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>
<link rel="icon" type="image/svg+xml" href="/static/sakura.svg"><link rel="stylesheet" href="/static/study.css">{js}
</head><body><main>{body}</main></body></html>"""


def participant_app(store: StudyStore, limits: Limits = Limits()) -> FastAPI:
    """The participants' origin: nothing but the study."""
    api = FastAPI(title="study", docs_url=None, redoc_url=None, openapi_url=None)
    _handlers(api)
    votes = RateLimit(limits.votes_per_minute, limits.min_vote_interval_s)
    consents = RateLimit(limits.consents_per_minute)

    def who(request: Request):
        p = store.participant(request.cookies.get(COOKIE))
        if p is None:
            raise StudyError("no study session: open the study's start page (or your resume link) first", 401)
        return p

    def with_cookie(resp: Response, token: str) -> Response:
        resp.set_cookie(COOKIE, token, max_age=30 * 86400, httponly=True, samesite="lax", path="/")
        return resp

    @api.get("/", response_class=HTMLResponse)
    def start(request: Request):
        if store.participant(request.cookies.get(COOKIE)):
            return RedirectResponse("/study", status_code=303)
        body = (f"<h1>Picture study</h1><div class='box'>{CONSENT}</div>"
                "<form method='post' action='/consent'><button class='primary' id='consent' type='submit'>"
                "I agree — start</button></form>")
        return HTMLResponse(_page("Picture study", body))

    @api.post("/consent")
    def consent(request: Request):
        if store.participant(request.cookies.get(COOKIE)):  # a reload or a second click keeps the id
            return RedirectResponse("/study", status_code=303)
        if not consents.allow(request.client.host if request.client else "?"):
            raise StudyError("too many new sessions from your address; please wait a minute", 429)
        _, token = store.new_participant()
        return with_cookie(RedirectResponse("/study", status_code=303), token)

    @api.get("/r/{token}")
    def resume(token: str):
        if store.participant(token) is None:
            raise StudyError("this resume link is not valid", 404)
        return with_cookie(RedirectResponse("/study", status_code=303), token)

    @api.get("/study", response_class=HTMLResponse)
    def study(request: Request):
        token = request.cookies.get(COOKIE)
        if store.participant(token) is None:
            return RedirectResponse("/", status_code=303)
        link = f"{str(request.base_url).rstrip('/')}/r/{token}"
        body = f"""<h1>Picture study</h1>
<p class="lead">Do the two pictures look <b>similar</b>? Keys: <kbd>S</kbd> similar, <kbd>N</kbd> not similar.</p>
<div class="progress"><div id="bar"></div></div><p id="status" class="status" role="status">Loading…</p>
<div class="pair" id="pair"><figure><img id="left" alt="picture A"><figcaption>A</figcaption></figure>
<figure><img id="right" alt="picture B"><figcaption>B</figcaption></figure></div>
<div class="buttons"><button class="primary" id="similar" disabled>Similar <kbd>S</kbd></button>
<button id="not-similar" disabled>Not similar <kbd>N</kbd></button></div>
<p class="resume">To continue later (here or on another device), keep this link:
<input id="resume" readonly value="{html.escape(link)}"></p>"""
        return HTMLResponse(_page("Picture study", body, "study.js"))

    @api.get("/api/next")
    def next_pair(request: Request):
        p = who(request)
        shown, done, total = store.next_pair(p)
        if shown is None and total == 0:
            return {"state": "preparing", "message": "The pictures are still being prepared; this page checks again "
                    "by itself in a few seconds."}
        if shown is None:
            return {"state": "done", "answered": done, "total": total}
        return {"state": "ask", "ticket": shown.ticket, "left": f"/img/{shown.left}", "right": f"/img/{shown.right}",
                "position": shown.position, "total": shown.total,
                "prefetch": [f"/img/{n}" for n in store.upcoming(p)]}

    @api.post("/api/vote")
    def vote(request: Request, body: VoteIn):
        p = who(request)
        if not votes.allow(str(p.number)):
            raise StudyError("too fast: please look at both pictures before answering", 429)
        store.vote(p, body.ticket, body.similar)
        return {"ok": True}

    @api.get("/img/{name}")
    def image(name: str, request: Request):
        who(request)
        path = store.image_path(name)
        if path is None:
            raise StudyError("no such picture", 404)
        return FileResponse(path, media_type="image/png", headers={"Cache-Control": "private, max-age=86400"})

    @api.get("/healthz")
    def healthz():
        return {"status": "ok"}

    api.mount("/static", StaticFiles(directory=STATIC / "study"), name="static")
    return api


def _prep_line(status: Callable[[], object] | None) -> str:
    s = status() if status else None
    if s is None:
        return ""
    parts = [f"prepared: {', '.join(s.done) or 'none yet'}"]
    if s.working_on:
        parts.append(f"preparing {s.working_on}")
    if s.waiting:
        parts.append(f"waiting for packs: {', '.join(s.waiting)}")
    if s.errors:
        parts.append(f"last error: {s.errors[-1]}")
    return "<br>Pool " + html.escape("; ".join(parts)) + "."


def operator_app(store: StudyStore, token: str, status: Callable[[], object] | None = None,
                 threshold: float = 0.8) -> FastAPI:
    """The operator's origin: the pool's progress, the report (plot + CSV), every vote as CSV. ``status``: the
    pool preparer's status (a dataclass), if one runs."""
    api = FastAPI(title="study operator", docs_url=None, redoc_url=None, openapi_url=None)
    _handlers(api)
    cache: dict[str, tuple[int, bytes]] = {}

    @api.middleware("http")
    async def need_token(request: Request, call_next):
        given = (request.query_params.get("token") or request.cookies.get(OPERATOR_COOKIE)
                 or request.headers.get("authorization", "").removeprefix("Bearer ").strip())
        if not given or not secrets.compare_digest(given.encode(), token.encode()):
            return _error(request, 403, "operator pages need the token printed when `sakura study serve` started")
        if request.query_params.get("token"):
            resp = RedirectResponse(request.url.path, status_code=303)
            resp.set_cookie(OPERATOR_COOKIE, token, httponly=True, samesite="strict", path="/")
            return resp
        return await call_next(request)

    def png() -> bytes:
        n = store.counts()["votes"]
        if cache.get("png", (-1, b""))[0] != n:
            cache["png"] = (n, report_png(build_report(store, threshold)))
        return cache["png"][1]

    @api.get("/", response_class=HTMLResponse)
    def home():
        rep = build_report(store, threshold)
        c = store.counts()
        kept = sum(s.kept for s in rep.screened)
        body = f"""<h1>Study — operator</h1><div class="box" id="op-status">Pool: {c['candidates']} test pairs and
{c['controls']} controls from {c['units']} template requests. {c['participants']} participants, {c['votes']} answers;
{kept} of {len(rep.screened)} who answered pass the screen ({html.escape(rep.rule)}).{_prep_line(status)}</div>
<p><a href="/report.csv">report CSV</a> · <a href="/participants.csv">screen CSV</a> ·
<a href="/votes.csv">every answer (CSV)</a> · <a href="/api/status">pool status (JSON)</a></p>
<img class="plot" id="op-plot" src="/report.png?v={c['votes']}" alt="similar rate against bytes and masked PSNR">"""
        return HTMLResponse(_page("Study — operator", body))

    @api.get("/api/status")
    def api_status():
        s = status() if status else None
        return {"counts": store.counts(), "pool": asdict(s) if s is not None else None}

    @api.get("/report.png")
    def report_plot():
        return Response(png(), media_type="image/png", headers={"Cache-Control": "no-store"})

    @api.get("/report.csv")
    def report_table():
        return Response(report_csv(build_report(store, threshold)), media_type="text/csv")

    @api.get("/participants.csv")
    def screen_table():
        rep = build_report(store, threshold)
        lines = ["participant,controls,correct,tests,kept"] + [
            f"{s.participant},{s.controls},{s.correct},{s.tests},{int(s.kept)}" for s in rep.screened]
        return Response("\n".join(lines) + "\n", media_type="text/csv")

    @api.get("/votes.csv")
    def all_votes():
        return Response(votes_csv(store), media_type="text/csv")

    api.mount("/static", StaticFiles(directory=STATIC / "study"), name="static")
    return api
