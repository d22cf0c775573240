"""``sakura study report`` on a scripted participant pool: participants who answer *similar* when the pair's
masked PSNR reaches a threshold, and careless ones who answer *similar* to everything. The screen must drop
exactly the careless; the per-system rates must be the ones the rule implies, so the systems come apart in
the plot and the CSV the way the pool's PSNRs say."""

from __future__ import annotations

import csv

import pytest
from study_helpers import LEVELS, SYSTEMS, psnr_of, synthetic_pool
from typer.testing import CliRunner

from app.cli import start_app
from app.study import Design, StudyStore, Vote
from app.study_cli import study_app
from app.study_report import build_report, screen, write_report
from app.study_sim import simulate
from app.study_web import Limits, participant_app

THRESHOLD = 32.0


@pytest.fixture(scope="module")
def answered(tmp_path_factory):
    store = StudyStore(tmp_path_factory.mktemp("sim"), Design(per_cell=2, controls=6), seed="sim")
    synthetic_pool(store)
    fast = Limits(votes_per_minute=10**6, min_vote_interval_s=0.0, consents_per_minute=10**6)
    with start_app(participant_app(store, fast), port=0) as srv:
        n = simulate(srv.url.rstrip("/"), store, attentive=6, careless=2, threshold=THRESHOLD)
    assert n == 8 * (len(SYSTEMS) * LEVELS * 2 + 6)
    return store


def test_the_screen_drops_exactly_the_careless(answered):
    rep = build_report(answered)
    assert len(rep.screened) == 8 and sum(s.kept for s in rep.screened) == 6
    for s in rep.screened:
        assert s.controls == 6 and s.tests == len(SYSTEMS) * LEVELS * 2
        assert s.kept == (s.correct == 6)  # careless: 3 of 6 (identical right, wrong-template wrong)
        assert s.kept or s.correct == 3
    assert "80 %" in rep.rule


def test_rates_follow_the_rule_and_separate_the_systems(answered):
    rep = build_report(answered)
    by_budget = {(r.system, int(r.level)): r for r in rep.rows if r.by == "budget"}
    assert set(by_budget) == {(s, k) for s in SYSTEMS for k in range(LEVELS)}
    for (s, k), r in by_budget.items():
        implied = 1.0 if psnr_of(s, k) >= THRESHOLD else 0.0
        assert r.n == 6 * 2 and r.rate == implied, (s, k, r)  # only kept participants count
        assert r.ci_low <= r.rate <= r.ci_high and (r.ci_high - r.ci_low) > 0.1
        assert r.psnr_masked_mean == pytest.approx(psnr_of(s, k))
    # at the smallest level SAKURA is judged similar, the baselines are not; bytes grow with the level
    assert by_budget[("sakura", 0)].rate == 1.0 and by_budget[("cachegen", 0)].rate == 0.0
    assert by_budget[("intq", 1)].rate == 1.0 and by_budget[("intq", 0)].rate == 0.0
    assert by_budget[("cachegen", 1)].rate == 0.0 and by_budget[("cachegen", 2)].rate == 1.0
    for s in SYSTEMS:
        assert [by_budget[(s, k)].bytes_mean for k in range(LEVELS)] == sorted(
            by_budget[(s, k)].bytes_mean for k in range(LEVELS))
    psnr_rows = [r for r in rep.rows if r.by == "psnr"]
    assert psnr_rows and all(r.rate == (1.0 if r.psnr_masked_mean >= THRESHOLD else 0.0) for r in psnr_rows)


def test_without_the_screen_the_careless_blur_the_systems(answered):
    """(The screen matters: keeping everyone puts 'similar' where the rule says not.)"""
    rep = build_report(answered, threshold=0.0)
    r = next(r for r in rep.rows if r.by == "budget" and r.system == "cachegen" and r.level == "0")
    assert r.n == 8 * 2 and r.rate == pytest.approx(2 / 8)


def test_report_files_and_cli(answered, tmp_path):
    """(``sakura study`` is registered through the entry point: tests/test_cli_startup.py.)"""
    out = tmp_path / "report"
    r = CliRunner().invoke(study_app, ["report", "--data", str(answered.folder), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "6 of 8 participants kept" in r.stdout
    rows = list(csv.DictReader((out / "study_report.csv").open()))
    assert {r["by"] for r in rows} == {"budget", "psnr"}
    cell = next(r for r in rows if r["by"] == "budget" and r["system"] == "sakura" and r["level"] == "0")
    assert float(cell["rate"]) == 1.0 and int(cell["n"]) == 12
    people = list(csv.DictReader((out / "participants.csv").open()))
    assert sum(int(p["kept"]) for p in people) == 6
    assert (out / "study_report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_report(answered, tmp_path / "again").rows == build_report(answered).rows
    bad = CliRunner().invoke(study_app, ["report", "--data", str(tmp_path / "none")])
    assert bad.exit_code == 2 and "no study in" in bad.stderr
    votes = tmp_path / "votes.csv"
    assert CliRunner().invoke(study_app, ["export", "--data", str(answered.folder), "--out", str(votes)]).exit_code == 0
    lines = list(csv.DictReader(votes.open()))
    assert len(lines) == 8 * (len(SYSTEMS) * LEVELS * 2 + 6) and {x["participant"] for x in lines} == {
        f"P{i:04d}" for i in range(1, 9)}


def test_a_participant_with_no_control_answered_is_not_kept(answered):
    pool = {c.id: c for c in answered.pool()}
    test = next(c for c in pool.values() if c.kind == "test")
    ctrl = next(c for c in pool.values() if c.kind == "identical")
    got = screen([Vote(1, "a", test.id, True, True, None, "t", 1.0), Vote(2, "b", test.id, True, True, None, "t", 1.0),
                  Vote(2, "c", ctrl.id, True, True, None, "t", 1.0)], pool)
    assert [(s.participant, s.controls, s.kept) for s in got] == [("P0001", 0, False), ("P0002", 1, True)]
