"""The live edit timeline: fold the device's events into a state, draw it as a plotly figure.

Events (from ``device_bridge``): ``accepted``, ``plan``, ``request``, ``arrival``, ``rebuilt``,
``shard_start``, ``shard_end``, then ``result`` or ``error``. :class:`EditTimeline` keeps what they
said; :meth:`EditTimeline.figure` draws, on one time axis (seconds since the edit started):

* top: the link's bandwidth along the trace, and the rate the runtime monitor estimated at each
  request (what the allocator believed);
* bottom, one row per shard: request → arrival of its cache (coloured by bytes vs FP16, labelled
  with the chosen level), rebuild, execution, the deadline the allocator aimed for, and stalls
  (execution waiting for the cache) in red.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORS = {"rebuild": "#8e7cc3", "execute": "#3d85c6", "stall": "#e03131", "deadline": "#222222",
          "trace": "#f08c00", "estimate": "#2b8a3e", "inflight": "rgba(120,120,120,0.35)"}


@dataclass
class UnitState:
    unit: int
    shard: int
    label: str = ""
    level: str = ""
    nbytes: int = 0
    request_t: float | None = None
    arrival_t: float | None = None
    rebuilt_t: float | None = None
    deadline: float | None = None
    rate_mbps: float | None = None
    budget_bytes: float | None = None
    fits: bool = True


@dataclass
class ShardState:
    shard: int
    label: str = ""
    start_t: float | None = None
    end_t: float | None = None
    stall_s: float = 0.0


@dataclass
class EditTimeline:
    system: str = ""
    shards: list[ShardState] = field(default_factory=list)
    units: dict[int, UnitState] = field(default_factory=dict)
    trace_t: list[float] = field(default_factory=list)
    trace_mbps: list[float] = field(default_factory=list)
    fp16_bytes: int = 0
    compute: dict = field(default_factory=dict)
    now: float = 0.0
    accepted: bool = False
    planned: bool = False
    done: bool = False
    error: str | None = None
    events: int = 0

    # ---------------------------------------------------------------------------------------------
    def apply(self, ev: dict) -> None:
        """Fold one event in. Unknown types and missing fields are ignored (forward compatible)."""
        self.events += 1
        kind = ev.get("type")
        t = ev.get("t")
        if isinstance(t, (int, float)):
            self.now = max(self.now, float(t))
        if kind == "accepted":
            self.accepted = True
        elif kind == "plan":
            self.planned = True
            self.shards = [ShardState(j, _shard_label(s)) for j, s in enumerate(ev.get("shards") or [])]
            for u in ev.get("units") or []:
                self.units[int(u["unit"])] = UnitState(int(u["unit"]), int(u.get("shard", 0)), u.get("label", ""))
            tr = ev.get("trace") or {}
            self.trace_t, self.trace_mbps = list(tr.get("t") or []), list(tr.get("mbps") or [])
            self.fp16_bytes = int(ev.get("fp16_bytes") or 0)
            self.compute = dict(ev.get("compute") or {})
        elif kind in ("request", "arrival", "rebuilt"):
            u = self._unit(ev)
            if kind == "request":
                u.level, u.nbytes = str(ev.get("level", "")), int(ev.get("bytes") or 0)
                u.request_t, u.deadline = t, ev.get("deadline")
                u.rate_mbps, u.budget_bytes = ev.get("rate_mbps"), ev.get("budget_bytes")
                u.fits = bool(ev.get("fits", True))
            elif kind == "arrival":
                u.arrival_t = t
                u.level = str(ev.get("level", u.level))
                u.nbytes = int(ev.get("bytes") or u.nbytes)
                if u.request_t is None:
                    u.request_t = t
            else:
                u.rebuilt_t = t
        elif kind in ("shard_start", "shard_end"):
            j = int(ev.get("shard", 0))
            while len(self.shards) <= j:
                self.shards.append(ShardState(len(self.shards)))
            if kind == "shard_start":
                self.shards[j].start_t, self.shards[j].stall_s = t, float(ev.get("stall_s") or 0.0)
            else:
                self.shards[j].end_t = t
        elif kind == "result":
            self.done = True
            lat = (ev.get("summary") or {}).get("latency_s")
            if isinstance(lat, (int, float)):
                self.now = max(self.now, float(lat))
        elif kind == "error":
            self.done, self.error = True, str(ev.get("message", "error"))

    def _unit(self, ev: dict) -> UnitState:
        i = int(ev.get("unit", 0))
        if i not in self.units:
            self.units[i] = UnitState(i, int(ev.get("shard", 0)), str(ev.get("label", "")))
        return self.units[i]

    # ---------------------------------------------------------------------------------------------
    @property
    def stall_s(self) -> float:
        return sum(s.stall_s for s in self.shards)

    @property
    def bytes_received(self) -> int:
        return sum(u.nbytes for u in self.units.values() if u.arrival_t is not None)

    def progress(self) -> tuple[int, int]:
        """(shards executed, shards in the plan)."""
        return sum(1 for s in self.shards if s.end_t is not None), len(self.shards)

    def status_line(self) -> str:
        if self.error:
            return f"{self.system}: failed: {self.error}"
        done, total = self.progress()
        if not self.accepted:
            return f"{self.system}: waiting for the device…"
        if not self.planned:
            return f"{self.system}: device is planning (measuring compute, reading pack headers)…"
        arrived = sum(1 for u in self.units.values() if u.arrival_t is not None)
        return (f"{self.system}: t = {self.now:.2f} s · shards executed {done}/{total} · cache units received "
                f"{arrived}/{len(self.units)} ({self.bytes_received / 1e6:.2f} MB) · stalls {self.stall_s:.2f} s")

    # ---------------------------------------------------------------------------------------------
    def figure(self, title: str | None = None) -> go.Figure:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.28, 0.72], vertical_spacing=0.06,
                            subplot_titles=("link bandwidth", "cache shards: request → arrival · rebuild · execute"))
        horizon = max(self.now, 0.5)
        if not self.done:  # while running: as far as the allocator expects execution to go
            deadlines = [u.deadline for u in self.units.values() if isinstance(u.deadline, (int, float))]
            masked = self.compute.get("masked_s")
            if deadlines:
                horizon = max(horizon, max(deadlines))
            elif isinstance(masked, (int, float)):
                horizon = max(horizon, masked)
        self._bandwidth(fig, horizon)
        self._shards(fig)
        n = max(1, len(self.shards))
        fig.update_yaxes(title_text="Mbps", row=1, col=1, rangemode="tozero")
        fig.update_yaxes(row=2, col=1, autorange=False, tickmode="array", tickvals=list(range(n)),
                         ticktext=[s.label or f"shard {s.shard}" for s in self.shards] or ["shard 0"],
                         range=[n - 0.5, -0.5])
        fig.update_xaxes(title_text="seconds since the edit started", row=2, col=1)
        fig.update_xaxes(range=[0, horizon * 1.04], row=1, col=1)
        fig.update_xaxes(range=[0, horizon * 1.04], row=2, col=1)
        fig.update_layout(barmode="overlay", height=max(460, 260 + 26 * n), margin=dict(l=10, r=10, t=50, b=90),
                          title=dict(text=title or f"live timeline — {self.system}", x=0.01, font=dict(size=15)),
                          legend=dict(orientation="h", yanchor="top", y=-0.1, xanchor="left", x=0),
                          uniformtext=dict(minsize=8, mode="hide"), template="plotly_white")
        return fig

    def _bandwidth(self, fig: go.Figure, horizon: float) -> None:
        if self.trace_t:
            end = horizon * 1.05
            xs, ys = [], []
            for t, r in zip(self.trace_t, self.trace_mbps):
                if t > end:
                    break
                xs.append(t)
                ys.append(r)
            if xs:  # carry the last step to the right edge
                xs.append(end)
                ys.append(ys[-1])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(shape="hv", color=COLORS["trace"], width=2),
                                     fill="tozeroy", fillcolor="rgba(240,140,0,0.12)", name="link (trace)"), 1, 1)
        est = sorted((u.request_t, u.rate_mbps) for u in self.units.values()
                     if u.request_t is not None and isinstance(u.rate_mbps, (int, float)) and u.rate_mbps > 0)
        if est:
            fig.add_trace(go.Scatter(x=[e[0] for e in est], y=[e[1] for e in est], mode="markers",
                                     marker=dict(color=COLORS["estimate"], size=6, symbol="diamond"),
                                     name="monitor estimate R̂"), 1, 1)

    def _shards(self, fig: go.Figure) -> None:
        shard_fp16 = self.fp16_bytes / len(self.shards) if self.shards and self.fp16_bytes else 0
        per_shard_units: dict[int, int] = {}
        for u in self.units.values():
            per_shard_units[u.shard] = per_shard_units.get(u.shard, 0) + 1
        done = [u for u in self.units.values() if u.request_t is not None and u.arrival_t is not None]
        if done:
            ratio = [(u.nbytes * per_shard_units.get(u.shard, 1) / shard_fp16) if shard_fp16 else 1.0 for u in done]
            fig.add_trace(go.Bar(
                y=[u.shard - 0.2 for u in done], base=[u.request_t for u in done],
                x=[max(u.arrival_t - u.request_t, 1e-4) for u in done], orientation="h", width=0.36,
                marker=dict(color=ratio, colorscale="Viridis", cmin=0, cmax=1,
                            colorbar=dict(title="bytes<br>vs FP16", len=0.55, y=0.3, thickness=12),
                            line=dict(color=["#e03131" if not u.fits else "rgba(0,0,0,0.25)" for u in done],
                                      width=[2 if not u.fits else 0.5 for u in done])),
                text=[u.level for u in done], textposition="inside", insidetextanchor="start",
                customdata=[[u.level, u.nbytes / 1e6, u.deadline or 0, u.rate_mbps or 0, u.label, r]
                            for u, r in zip(done, ratio)],
                hovertemplate=("%{customdata[4]}<br>level %{customdata[0]} · %{customdata[1]:.3f} MB "
                               "(%{customdata[5]:.0%} of FP16)<br>requested %{base:.3f} s, arrived %{x:.3f} s later"
                               "<br>deadline %{customdata[2]:.3f} s · R̂ %{customdata[3]:.0f} Mbps<extra>transfer</extra>"),
                name="transfer (colour: bytes vs FP16)"), 2, 1)
        flying = [u for u in self.units.values() if u.request_t is not None and u.arrival_t is None]
        if flying:
            fig.add_trace(go.Bar(y=[u.shard - 0.2 for u in flying], base=[u.request_t for u in flying],
                                 x=[max(self.now - u.request_t, 1e-3) for u in flying], orientation="h", width=0.36,
                                 marker=dict(color=COLORS["inflight"], line=dict(color="#555", width=1)),
                                 text=[u.level for u in flying], textposition="inside", name="in flight",
                                 hovertemplate="in flight: %{text}<extra></extra>"), 2, 1)
        rebuilt = [u for u in self.units.values() if u.arrival_t is not None and u.rebuilt_t is not None]
        if rebuilt:
            fig.add_trace(go.Bar(y=[u.shard - 0.2 for u in rebuilt], base=[u.arrival_t for u in rebuilt],
                                 x=[max(u.rebuilt_t - u.arrival_t, 1e-4) for u in rebuilt], orientation="h",
                                 width=0.16, offset=0.1, marker=dict(color=COLORS["rebuild"]), name="rebuild",
                                 hovertemplate="rebuild %{x:.3f} s<extra></extra>"), 2, 1)
        ex = [s for s in self.shards if s.start_t is not None]
        if ex:
            fig.add_trace(go.Bar(y=[s.shard + 0.2 for s in ex], base=[s.start_t for s in ex],
                                 x=[max((s.end_t if s.end_t is not None else self.now) - s.start_t, 1e-4) for s in ex],
                                 orientation="h", width=0.36, marker=dict(color=COLORS["execute"]), name="execute",
                                 hovertemplate="execute from %{base:.3f} s for %{x:.3f} s<extra></extra>"), 2, 1)
        stalls = [s for s in ex if s.stall_s > 1e-3]
        if stalls:
            fig.add_trace(go.Bar(y=[s.shard + 0.2 for s in stalls], base=[s.start_t - s.stall_s for s in stalls],
                                 x=[s.stall_s for s in stalls], orientation="h", width=0.36,
                                 marker=dict(color=COLORS["stall"], pattern=dict(shape="/")), name="stall",
                                 hovertemplate="stalled %{x:.3f} s waiting for cache<extra></extra>"), 2, 1)
        dl = [u for u in self.units.values() if isinstance(u.deadline, (int, float)) and u.request_t is not None]
        if dl:
            fig.add_trace(go.Scatter(y=[u.shard - 0.2 for u in dl], x=[u.deadline for u in dl], mode="markers",
                                     marker=dict(symbol="line-ns-open", size=16, color=COLORS["deadline"],
                                                 line=dict(width=2, color=COLORS["deadline"])),
                                     name="deadline", hovertemplate="deadline %{x:.3f} s<extra></extra>"), 2, 1)


def _shard_label(s) -> str:
    try:
        step, l0, l1 = s
        return f"step {step} · L{l0}–{l1 - 1}"
    except (TypeError, ValueError):
        return str(s)


def latency_figure(rows: list[dict]) -> go.Figure:
    """Latency breakdown per run: compute, transfer hidden behind compute, exposed stalls; bytes vs FP16
    on a second axis. ``rows``: dicts with system, latency_s, stall_s, transfer_hidden_s, bytes, fp16_bytes."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("latency breakdown (s)", "bytes sent vs FP16 cache"),
                        horizontal_spacing=0.16)
    names = [r["system"] for r in rows]
    stall = [float(r.get("stall_s") or 0) for r in rows]
    compute = [max(0.0, float(r.get("latency_s") or 0) - s) for r, s in zip(rows, stall)]
    hidden = [float(r.get("transfer_hidden_s") or 0) for r in rows]
    fig.add_trace(go.Bar(y=names, x=compute, orientation="h", name="compute", marker_color=COLORS["execute"]), 1, 1)
    fig.add_trace(go.Bar(y=names, x=stall, base=compute, orientation="h", name="stall (transfer exposed)",
                         marker_color=COLORS["stall"]), 1, 1)
    fig.add_trace(go.Scatter(y=names, x=hidden, mode="markers", name="transfer hidden behind compute",
                             marker=dict(symbol="diamond", size=11, color=COLORS["estimate"])), 1, 1)
    fp16 = [float(r.get("fp16_bytes") or 0) for r in rows]
    sent = [float(r.get("bytes") or 0) for r in rows]
    fig.add_trace(go.Bar(y=names, x=[b / 1e6 for b in fp16], orientation="h", name="FP16 cache",
                         marker_color="rgba(0,0,0,0.12)"), 1, 2)
    fig.add_trace(go.Bar(y=names, x=[b / 1e6 for b in sent], orientation="h", name="sent",
                         marker_color=COLORS["trace"],
                         text=[f"{b / f:.0%}" if f else "" for b, f in zip(sent, fp16)], textposition="outside"), 1, 2)
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_xaxes(title_text="MB", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(barmode="overlay", height=140 + 40 * len(rows), margin=dict(l=10, r=10, t=40, b=40),
                      legend=dict(orientation="h", y=-0.35), template="plotly_white")
    return fig
