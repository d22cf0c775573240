"""Scripted participants for the study: each goes through the participants' HTTP origin exactly as a browser
does (consent → next → vote …) and answers by a rule, so the whole chain — pool, queue, controls, screen,
report — can be checked against what the rule implies.

``attentive``: *similar* when the pair's masked PSNR ≥ ``threshold`` dB (controls answered right);
``careless``: always *similar* (fails every wrong-template control). The rule reads the pair's masked PSNR
from the store (the operator's side): the participant's origin never tells it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from app.study import CONTROL_ANSWER, StudyStore


@dataclass(frozen=True)
class Scripted:
    kind: str  # "attentive" | "careless"
    threshold: float = 35.0

    def answer(self, kind: str, psnr_masked: float | None) -> bool:
        if self.kind == "careless":
            return True
        if kind in CONTROL_ANSWER:
            return CONTROL_ANSWER[kind]
        return psnr_masked is not None and psnr_masked >= self.threshold


def run_participant(base_url: str, store: StudyStore, who: Scripted, limit: int | None = None) -> int:
    """One scripted participant over HTTP; returns the number of answers given."""
    n = 0
    with httpx.Client(base_url=base_url, follow_redirects=True, timeout=30) as c:
        c.post("/consent").raise_for_status()
        while limit is None or n < limit:
            d = c.get("/api/next").raise_for_status().json()
            if d["state"] != "ask":
                break
            for src in (d["left"], d["right"]):
                c.get(src).raise_for_status()
            cand = store.candidate_of(d["ticket"])
            c.post("/api/vote", json={"ticket": d["ticket"],
                                      "similar": who.answer(cand.kind, cand.psnr_masked)}).raise_for_status()
            n += 1
    return n


def simulate(base_url: str, store: StudyStore, attentive: int, careless: int, threshold: float) -> int:
    """``attentive`` + ``careless`` participants, interleaved; returns the answers given."""
    people = [Scripted("attentive", threshold)] * attentive + [Scripted("careless", threshold)] * careless
    random.Random(0).shuffle(people)  # the careless ones spread over the participant numbers
    return sum(run_participant(base_url, store, p) for p in people)
