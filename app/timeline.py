"""The live edit timeline, drawn from the device's events as a plotly figure.

The events (``device_bridge.protocol``) are folded by :class:`~device_bridge.protocol.EditProgress`
into the runtime's own :class:`~sakura.runtime.timeline.Timeline` plus the edit's plan;
:func:`timeline_figure` draws that, on one time axis (seconds since the edit started):

* top: the link's bandwidth along the trace, and the rate the runtime monitor estimated at each
  request (what the allocator believed);
* bottom, one row per shard: request → arrival of its cache (coloured by bytes vs FP16, labelled
  with the chosen level), rebuild, execution, the deadline the allocator aimed for, and stalls
  (execution waiting for the cache) in red.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from device_bridge import EditProgress

COLORS = {"rebuild": "#8e7cc3", "execute": "#3d85c6", "stall": "#e03131", "deadline": "#222222",
          "trace": "#f08c00", "estimate": "#2b8a3e", "inflight": "rgba(120,120,120,0.35)"}


def timeline_figure(progress: EditProgress, title: str | None = None) -> go.Figure:
    """The timeline of one edit so far (or finished)."""
    tl, plan = progress.timeline, progress.plan
    exec_name, rebuild_name = stack_names(plan)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.28, 0.72], vertical_spacing=0.06,
                        subplot_titles=("link bandwidth", f"cache shards: request → arrival · rebuild ({rebuild_name}) "
                                        f"· execute ({exec_name}) — host CPU" if exec_name else
                                        "cache shards: request → arrival · rebuild · execute"))
    horizon = max(progress.now, 0.5)
    if not progress.done:  # while running: as far as the allocator expects execution to go
        deadlines = [u.deadline_t for u in tl.units]
        masked = (plan.get("compute") or {}).get("masked_s")
        if deadlines:
            horizon = max(horizon, max(deadlines))
        elif isinstance(masked, (int, float)):
            horizon = max(horizon, masked)
    _bandwidth(progress, fig, horizon)
    _shards(progress, fig)
    n = max(1, len(tl.shards))
    fig.update_yaxes(title_text="Mbps", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(row=2, col=1, autorange=False, tickmode="array", tickvals=list(range(n)),
                     ticktext=[s.label for s in tl.shards] or ["shard 0"],
                     range=[n - 0.5, -0.5])
    fig.update_xaxes(title_text="seconds since the edit started", row=2, col=1)
    fig.update_xaxes(range=[0, horizon * 1.04], row=1, col=1)
    fig.update_xaxes(range=[0, horizon * 1.04], row=2, col=1)
    fig.update_layout(barmode="overlay", height=max(460, 260 + 26 * n), margin=dict(l=10, r=10, t=50, b=90),
                      title=dict(text=_title(progress, title), x=0.01, font=dict(size=15)),
                      legend=dict(orientation="h", yanchor="top", y=-0.1, xanchor="left", x=0),
                      uniformtext=dict(minsize=8, mode="hide"), template="plotly_white")
    return fig


def stack_names(plan: dict) -> tuple[str, str]:
    """(executor, reconstructor) titles from the plan's backends record (what ran the execute / rebuild bars)."""
    b = plan.get("backends") or {}  # (an agent that does not say: empty names)
    return (str(b.get("executor_title") or b.get("executor") or ""),
            str(b.get("reconstructor_title") or b.get("reconstructor") or ""))


def _title(progress: EditProgress, title: str | None) -> str:
    """The given title (or "live timeline — SYSTEM"), and what prefetch had put on the device by Run."""
    title = title or f"live timeline — {progress.system}"
    held = progress.plan.get("prefetched") or {}
    if held.get("bytes"):
        title += (f" · {held['bytes'] / 1e6:.2f} MB ({held.get('units', 0)} shards) already on the device at Run "
                  "(prefetched when the template was picked)")
    return title


def _bandwidth(progress: EditProgress, fig: go.Figure, horizon: float) -> None:
    tl, trace = progress.timeline, progress.plan.get("trace") or {}
    trace_t, trace_mbps = trace.get("t") or [], trace.get("mbps") or []
    if trace_t:
        end = horizon * 1.05
        xs, ys = [], []
        for t, r in zip(trace_t, trace_mbps):
            if t > end:
                break
            xs.append(t)
            ys.append(r)
        if xs:  # carry the last step to the right edge
            xs.append(end)
            ys.append(ys[-1])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(shape="hv", color=COLORS["trace"], width=2),
                                 fill="tozeroy", fillcolor="rgba(240,140,0,0.12)", name="link (trace)"), 1, 1)
    est = sorted((u.request_t, u.rate_mbps) for u in tl.units if u.rate_mbps > 0)
    if est:
        fig.add_trace(go.Scatter(x=[e[0] for e in est], y=[e[1] for e in est], mode="markers",
                                 marker=dict(color=COLORS["estimate"], size=6, symbol="diamond"),
                                 name="monitor estimate R̂"), 1, 1)


def _shards(progress: EditProgress, fig: go.Figure) -> None:
    tl, now = progress.timeline, progress.now
    exec_name, rebuild_name = stack_names(progress.plan)
    fp16_bytes = int(progress.plan.get("fp16_bytes") or 0)
    shard_fp16 = fp16_bytes / len(tl.shards) if tl.shards and fp16_bytes else 0
    per_shard_units: dict[int, int] = {}
    for u in tl.units:
        per_shard_units[u.needed_by] = per_shard_units.get(u.needed_by, 0) + 1
    done = [u for u in tl.units if u.arrival_t is not None]
    if done:
        ratio = [(u.nbytes * per_shard_units.get(u.needed_by, 1) / shard_fp16) if shard_fp16 else 1.0 for u in done]
        fig.add_trace(go.Bar(
            y=[u.needed_by - 0.2 for u in done], base=[u.request_t for u in done],
            x=[max(u.arrival_t - u.request_t, 1e-4) for u in done], orientation="h", width=0.36,
            marker=dict(color=ratio, colorscale="Viridis", cmin=0, cmax=1,
                        colorbar=dict(title="bytes<br>vs FP16", len=0.55, y=0.3, thickness=12),
                        line=dict(color=["#e03131" if not u.fits else "#f08c00" if u.rung else "rgba(0,0,0,0.25)"
                                         for u in done],
                                  width=[2 if not u.fits or u.rung else 0.5 for u in done])),
            text=[f"{u.level} (prefetched; {u.requested_level} came late)" if u.dropped and u.prefetched else
                  f"{u.level} (prefetched, on device)" if u.prefetched else
                  f"dropped {u.requested_level} (fallback)" if u.dropped else
                  f"{u.level} of {u.requested_level} (cut)" if u.requested_level else
                  f"▲ {u.level} (above the allocated levels)" if u.rung else u.level for u in done],
            textposition="inside", insidetextanchor="start",
            customdata=[[u.level, u.nbytes / 1e6, u.deadline_t, u.rate_mbps, u.label, r]
                        for u, r in zip(done, ratio)],
            hovertemplate=("%{customdata[4]}<br>level %{customdata[0]} · %{customdata[1]:.3f} MB "
                           "(%{customdata[5]:.0%} of FP16)<br>requested %{base:.3f} s, arrived %{x:.3f} s later"
                           "<br>deadline %{customdata[2]:.3f} s · R̂ %{customdata[3]:.0f} Mbps<extra>transfer</extra>"),
            name="transfer (colour: bytes vs FP16)"), 2, 1)
    flying = [u for u in tl.units if u.arrival_t is None]
    if flying:
        fig.add_trace(go.Bar(y=[u.needed_by - 0.2 for u in flying], base=[u.request_t for u in flying],
                             x=[max(now - u.request_t, 1e-3) for u in flying], orientation="h", width=0.36,
                             marker=dict(color=COLORS["inflight"], line=dict(color="#555", width=1)),
                             text=[u.level for u in flying], textposition="inside", name="in flight",
                             hovertemplate="in flight: %{text}<extra></extra>"), 2, 1)
    rebuilt = [u for u in tl.units if u.arrival_t is not None and u.rebuild_done_t is not None]
    if rebuilt:
        fig.add_trace(go.Bar(y=[u.needed_by - 0.2 for u in rebuilt], base=[u.arrival_t for u in rebuilt],
                             x=[max(u.rebuild_done_t - u.arrival_t, 1e-4) for u in rebuilt], orientation="h",
                             width=0.16, offset=0.1, marker=dict(color=COLORS["rebuild"]),
                             name=f"rebuild · {rebuild_name}" if rebuild_name else "rebuild",
                             hovertemplate=f"rebuild{' on ' + rebuild_name if rebuild_name else ''} %{{x:.3f}} s"
                             "<extra></extra>"), 2, 1)
    ex = [s for s in tl.shards if s.exec_start_t is not None]
    if ex:
        fig.add_trace(
            go.Bar(
                y=[s.shard + 0.2 for s in ex],
                base=[s.exec_start_t for s in ex],
                x=[max((s.exec_end_t if s.exec_end_t is not None else now) - s.exec_start_t, 1e-4) for s in ex],
                orientation="h",
                width=0.36,
                marker=dict(color=COLORS["execute"]),
                name=f"execute · {exec_name}" if exec_name else "execute",
                text=[exec_name] * len(ex) if exec_name else None, textposition="inside", insidetextanchor="middle",
                hovertemplate=f"execute{' on ' + exec_name if exec_name else ''} from %{{base:.3f}} s for "
                "%{x:.3f} s<extra></extra>",
            ),
            2,
            1,
        )
    stalls = [s for s in ex if s.stall_s > 1e-3]
    if stalls:
        fig.add_trace(go.Bar(y=[s.shard + 0.2 for s in stalls], base=[s.exec_start_t - s.stall_s for s in stalls],
                             x=[s.stall_s for s in stalls], orientation="h", width=0.36,
                             marker=dict(color=COLORS["stall"], pattern=dict(shape="/")), name="stall",
                             hovertemplate="stalled %{x:.3f} s waiting for cache<extra></extra>"), 2, 1)
    _fallbacks(progress, fig)
    dl = tl.units
    if dl:
        fig.add_trace(go.Scatter(y=[u.needed_by - 0.2 for u in dl], x=[u.deadline_t for u in dl], mode="markers",
                                 marker=dict(symbol="line-ns-open", size=16, color=COLORS["deadline"],
                                             line=dict(width=2, color=COLORS["deadline"])),
                                 name="deadline", hovertemplate="deadline %{x:.3f} s<extra></extra>"), 2, 1)


FALLBACK_TEXT = {"reuse": "reused step−1 K/V", "local": "went local: every token from here"}


def _fallbacks(progress: EditProgress, fig: go.Figure) -> None:
    """Where execution did not wait: a marker on the shard, and for ``local`` a band to the end."""
    fired = progress.timeline.fallbacks
    if not fired:
        return
    fig.add_trace(
        go.Scatter(
            y=[f["shard"] for f in fired],
            x=[f["t"] for f in fired],
            mode="markers+text",
            marker=dict(symbol="star", size=13, color="#f03e3e", line=dict(color="#222", width=1)),
            text=[FALLBACK_TEXT.get(f["kind"], f["kind"]) for f in fired],
            textposition="middle right",
            textfont=dict(size=10, color="#c92a2a"),
            name="fallback",
            customdata=[
                [f["kind"], ", ".join(f"{k} {v:.2f} s" for k, v in (f.get("predicted_end_s") or {}).items())]
                for f in fired
            ],
            hovertemplate="fallback %{customdata[0]} at %{x:.3f} s<br>predicted end: %{customdata[1]}<extra></extra>",
        ),
        2,
        1,
    )
    local = next((f for f in fired if f["kind"] == "local"), None)
    if local is not None:
        end = max(progress.now, local["t"] + 1e-3)
        fig.add_vrect(x0=local["t"], x1=end, fillcolor="rgba(240,62,62,0.08)", line_width=0, row=2, col=1)


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
