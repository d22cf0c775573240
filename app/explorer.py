"""The quality explorer's view of a frontier: the best point per system within a budget, and the plot.

The frontier itself (real edits from the bytes each configuration sends) is computed on the device
side of the demo by :class:`sakura.eval.explorer.Explorer`, which ``app/cli.py`` hands to the page.
"""

from __future__ import annotations

import math

from device_bridge import COMPRESSED, SYSTEMS

SYSTEMS_SHOWN = COMPRESSED


def at_budget(data: dict, budget_bytes: float, metric: str = "psnr_masked") -> dict[str, dict | None]:
    """Per system, the point of best ``metric`` that sends at most ``budget_bytes`` (None if none fits)."""
    out: dict[str, dict | None] = {}
    for s in SYSTEMS_SHOWN:
        fit = [p for p in data["points"] if p["system"] == s and p["bytes"] <= budget_bytes]
        out[s] = max(fit, key=lambda p: (p[metric], -p["bytes"])) if fit else None
    return out


METRICS = {"psnr_masked": "masked PSNR vs FP16-cache output (dB)", "psnr": "PSNR vs FP16-cache output (dB)",
           "ssim_masked": "masked SSIM", "ssim": "SSIM"}


def frontier_figure(data: dict, budget_bytes: float | None = None, metric: str = "psnr_masked"):
    import plotly.graph_objects as go

    colors = {s: SYSTEMS[s].color for s in SYSTEMS_SHOWN}
    names = {s: SYSTEMS[s].label for s in SYSTEMS_SHOWN}
    fig = go.Figure()
    for s in SYSTEMS_SHOWN:
        pts = sorted((p for p in data["points"] if p["system"] == s), key=lambda p: p["bytes"])
        fig.add_trace(
            go.Scatter(
                x=[p["bytes"] / 1e6 for p in pts],
                y=[p[metric] for p in pts],
                mode="lines+markers",
                name=names[s],
                line=dict(color=colors[s], width=2),
                marker=dict(size=8),
                customdata=[[p["config"], p["psnr"], p["psnr_masked"]] for p in pts],
                hovertemplate=(
                    "%{x:.2f} MB · %{y:.2f}<br>%{customdata[0]}<br>PSNR %{customdata[1]:.2f} dB"
                    " · masked %{customdata[2]:.2f} dB<extra>" + names[s] + "</extra>"
                ),
            )
        )
    # On a log axis plotly takes a shape's x in data units (MB, like the markers) but an annotation's x and the
    # axis range in log10 units: the lines once sat at 10^(log10 MB) (a 3.89 MB budget drawn at 0.59 MB).
    xs = [p["bytes"] / 1e6 for p in data["points"]] + [data["fp16_bytes"] / 1e6]
    lo, hi = math.log10(min(xs)) - 0.08, math.log10(max(xs)) + 0.08
    marks = [(data["fp16_bytes"], "FP16 cache", "#adb5bd", "dot")]
    if budget_bytes is not None:
        marks.append((budget_bytes, f"budget {budget_bytes / 1e6:.2f} MB", "#495057", "dash"))
    for b, text, color, dash in marks:
        mb = max(b, 1) / 1e6
        fig.add_shape(type="line", xref="x", yref="paper", x0=mb, x1=mb, y0=0, y1=1, line=dict(color=color, dash=dash))
        fig.add_annotation(x=math.log10(mb), y=1.0, xref="x", yref="paper", text=text, showarrow=False,
                           yanchor="bottom", font=dict(size=11, color=color))
    fig.update_layout(
        title=dict(
            text=f"quality vs bytes sent — {data['template_id']}, request “{data['request_label']}”",
            x=0.01,
            font=dict(size=14),
        ),
        xaxis=dict(title="bytes sent (MB, log scale)", type="log", range=[lo, hi]),
        yaxis=dict(title=METRICS.get(metric, metric)),
        height=440,
        margin=dict(l=10, r=10, t=90, b=40),
        template="plotly_white",
        legend=dict(orientation="h", y=1.1, yanchor="bottom", x=1, xanchor="right"),
    )
    return fig
