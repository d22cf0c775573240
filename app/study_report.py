"""``sakura study report``: who passes the control screen, and per system the share of *similar* answers
(Wilson 95 % intervals) against the bytes sent and against masked PSNR — a CSV and a PNG plot.

Screen: a participant is kept when they answered at least ``min_controls`` control pairs and got at least
``threshold`` (default 80 %) of them right (identical pair → similar; wrong-template pair → not similar).
Only kept participants' answers to test pairs count.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from app.study import CONTROL_ANSWER, Candidate, StudyStore, Vote, wilson
from device_bridge import SYSTEMS

SCREEN_RULE = "kept: ≥ {min_controls} control pair(s) answered and ≥ {pct:.0f} % of them right"
PSNR_BIN_DB = 4.0  # width of the masked-PSNR bins of the second panel


@dataclass(frozen=True)
class Screened:
    participant: str
    controls: int
    correct: int
    tests: int
    kept: bool


@dataclass(frozen=True)
class Row:
    """One point of the report: a system at one budget level (``by="budget"``) or in one masked-PSNR bin
    (``by="psnr"``)."""
    by: str
    system: str
    level: str  # budget level (0 = smallest) or the PSNR bin "32-36"
    candidates: int
    bytes_mean: float
    fraction_mean: float  # of the FP16 cache
    psnr_masked_mean: float
    ssim_mean: float
    n: int
    similar: int
    rate: float | None
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class Report:
    rule: str
    screened: list[Screened]
    rows: list[Row]

    @property
    def kept(self) -> list[str]:
        return [s.participant for s in self.screened if s.kept]


def screen(votes: list[Vote], pool: dict[str, Candidate], threshold: float = 0.8,
           min_controls: int = 1) -> list[Screened]:
    per: dict[int, list[int]] = {}
    for v in votes:
        c = pool.get(v.candidate)
        if c is None:
            continue
        s = per.setdefault(v.participant, [0, 0, 0])
        if c.kind in CONTROL_ANSWER:
            s[0] += 1
            s[1] += int(v.similar == CONTROL_ANSWER[c.kind])
        else:
            s[2] += 1
    return [Screened(f"P{p:04d}", n, k, t, n >= min_controls and k >= threshold * n - 1e-9)
            for p, (n, k, t) in sorted(per.items())]


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def _row(by: str, system: str, level: str, cands: list[Candidate], answers: list[bool]) -> Row:
    k, n = sum(answers), len(answers)
    lo, hi = wilson(k, n)
    return Row(by, system, level, len({c.id for c in cands}), _mean([c.bytes for c in cands]),
               _mean([c.fraction for c in cands]), _mean([c.psnr_masked for c in cands]),
               _mean([c.ssim for c in cands]), n, k, k / n if n else None, lo, hi)


def build_report(store: StudyStore, threshold: float = 0.8, min_controls: int = 1) -> Report:
    pool = {c.id: c for c in store.pool()}
    votes = store.votes()
    screened = screen(votes, pool, threshold, min_controls)
    kept = {int(s.participant[1:]) for s in screened if s.kept}
    answers = [(pool[v.candidate], v.similar) for v in votes
               if v.participant in kept and v.candidate in pool and pool[v.candidate].kind == "test"]
    rows: list[Row] = []
    systems = sorted({c.system for c in pool.values() if c.kind == "test"}, key=_system_order)
    for s in systems:
        for level in sorted({c.budget for c in pool.values() if c.system == s and c.kind == "test"}):
            cands = [c for c in pool.values() if c.system == s and c.kind == "test" and c.budget == level]
            rows.append(_row("budget", s, str(level), cands, [a for c, a in answers if c.system == s
                                                               and c.budget == level]))
    for s in systems:
        bins: dict[int, list[tuple[Candidate, bool]]] = {}
        for c, a in answers:
            if c.system == s and c.psnr_masked is not None:
                bins.setdefault(int(math.floor(c.psnr_masked / PSNR_BIN_DB)), []).append((c, a))
        for b in sorted(bins):
            lo = b * PSNR_BIN_DB
            rows.append(_row("psnr", s, f"{lo:g}-{lo + PSNR_BIN_DB:g}", [c for c, _ in bins[b]],
                             [a for _, a in bins[b]]))
    rule = SCREEN_RULE.format(min_controls=min_controls, pct=100 * threshold)
    return Report(rule, screened, rows)


def _system_order(name: str) -> tuple[int, str]:
    names = list(SYSTEMS)
    return (names.index(name) if name in names else len(names), name)


def _label(system: str) -> str:
    return SYSTEMS[system].label if system in SYSTEMS else system


def report_csv(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    cols = list(Row.__dataclass_fields__)
    w.writerow(cols)
    for r in rep.rows:
        w.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in asdict(r).values()])
    return buf.getvalue()


def report_figure(rep: Report):
    """Two panels: share judged similar (Wilson 95 %) against MB sent (log) and against masked PSNR."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for ax, by in zip(axes, ("budget", "psnr")):
        for s in dict.fromkeys(r.system for r in rep.rows):
            rows = [r for r in rep.rows if r.by == by and r.system == s and r.n]
            if not rows:
                continue
            xs = [r.bytes_mean / 1e6 if by == "budget" else r.psnr_masked_mean for r in rows]
            ys = [100 * r.rate for r in rows]
            err = [[max(0.0, 100 * (r.rate - r.ci_low)) for r in rows], [max(0.0, 100 * (r.ci_high - r.rate))
                                                                           for r in rows]]
            color = SYSTEMS[s].color if s in SYSTEMS else None
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=_label(s), color=color)
        ax.set_ylim(-3, 103)
        ax.set_ylabel("judged similar to the FP16-cache output (%)")
        ax.grid(alpha=0.3)
        if by == "budget":
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # matplotlib: only when plotting

            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("bytes sent (MB, log; one point per budget level)")
        else:
            ax.set_xlabel(f"masked PSNR vs FP16-cache output (dB, {PSNR_BIN_DB:g} dB bins)")
    kept = sum(s.kept for s in rep.screened)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(loc="lower right")
    fig.suptitle(f"Share judged similar, Wilson 95 % intervals — {kept} of {len(rep.screened)} participants kept "
                 f"({rep.rule})", fontsize=10)
    return fig


def report_png(rep: Report) -> bytes:
    import matplotlib.pyplot as plt  # matplotlib: only when a plot is drawn

    fig = report_figure(rep)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_report(store: StudyStore, out: str | Path, threshold: float = 0.8, min_controls: int = 1) -> Report:
    """``study_report.csv`` (the rows), ``participants.csv`` (the screen), ``study_report.png`` and
    ``study_report.json`` (both) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = build_report(store, threshold, min_controls)
    (out / "study_report.csv").write_text(report_csv(rep), encoding="utf-8")
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["participant", "controls", "correct", "tests", "kept"])
    for s in rep.screened:
        w.writerow([s.participant, s.controls, s.correct, s.tests, int(s.kept)])
    (out / "participants.csv").write_text(buf.getvalue(), encoding="utf-8")
    (out / "study_report.png").write_bytes(report_png(rep))
    (out / "study_report.json").write_text(json.dumps(
        {"rule": rep.rule, "screened": [asdict(s) for s in rep.screened],
         "rows": [asdict(r) for r in rep.rows]}, indent=1, default=_nan_none), encoding="utf-8")
    return rep


def votes_csv(store: StudyStore) -> str:
    """Every answer with its pair's attributes (participants by label; tokens never leave the store)."""
    pool = {c.id: c for c in store.pool()}
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["participant", "kind", "workload", "template_id", "request", "system", "budget", "bytes",
                "fp16_bytes", "psnr_masked", "ssim", "similar", "reference_left", "shown_at", "answered_at", "seconds"])
    for v in store.votes():
        c = pool.get(v.candidate)
        if c is None:
            continue
        w.writerow([f"P{v.participant:04d}", c.kind, c.workload, c.template_id, c.request, c.system, c.budget,
                    c.bytes, c.fp16_bytes, c.psnr_masked, c.ssim, int(v.similar), int(v.reference_left), v.shown_at,
                    v.answered_at, v.seconds])
    return buf.getvalue()


def _nan_none(x):
    return None
