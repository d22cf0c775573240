"""The result panels of the edit page: metric cards, the comparison table, what left the device."""

from __future__ import annotations

import html

from app.device import SYSTEM_TITLES


def _esc(x) -> str:
    return html.escape(str(x))


def status_html(text: str, kind: str = "info") -> str:
    return f'<div class="sk-status sk-{kind}" role="status">{_esc(text)}</div>'


def metrics_html(result: dict) -> str:
    m = result.get("metrics") or {}
    s = result.get("summary") or {}
    fp16 = s.get("fp16_bytes") or 0
    sent = s.get("bytes") or 0

    def card(title, value, sub=""):
        return (f'<div class="sk-card"><div class="sk-card-t">{_esc(title)}</div>'
                f'<div class="sk-card-v">{value}</div><div class="sk-card-s">{sub}</div></div>')

    def num(x, fmt):
        return "—" if not isinstance(x, (int, float)) else format(x, fmt)

    cards = [
        card("PSNR (whole / masked)", f"{num(m.get('psnr'), '.2f')} / {num(m.get('psnr_masked'), '.2f')} dB",
             "vs FP16-cache output"),
        card("SSIM (whole / masked)", f"{num(m.get('ssim'), '.4f')} / {num(m.get('ssim_masked'), '.4f')}",
             "vs FP16-cache output"),
        card("Latency", f"{num(s.get('latency_s'), '.3f')} s",
             f"execution {num((s.get('latency_s') or 0) - (s.get('stall_s') or 0), '.3f')} s + stalls "
             f"{num(s.get('stall_s'), '.3f')} s"),
        card("Transfer", f"{num(s.get('transfer_hidden_s'), '.3f')} s hidden",
             f"{num(s.get('transfer_exposed_s'), '.3f')} s of the {num(s.get('stall_s'), '.3f')} s stalls waited on "
             f"the link; the other {num(max(0.0, (s.get('stall_s') or 0) - (s.get('transfer_exposed_s') or 0)), '.3f')}"
             " s on rebuilds"),
        card("Bytes sent", f"{sent / 1e6:.2f} MB",
             f"{(sent / fp16 if fp16 else 0):.1%} of the {fp16 / 1e6:.1f} MB FP16 cache" if fp16 else ""),
    ]
    levels = s.get("levels") or []
    if levels:
        distinct = list(dict.fromkeys(levels))
        lv = ", ".join(distinct[:6]) + ("…" if len(distinct) > 6 else "")
        cards.append(card("Levels chosen", f"{len(distinct)} distinct", _esc(lv)))
    return f'<div class="sk-cards" id="sk-metrics-cards">{"".join(cards)}</div>'


def privacy_rows(sent: list[dict]) -> list[list]:
    rows = []
    for i, r in enumerate(sent or []):
        rs = r.get("ranges") or []
        shown = ", ".join(f"{o}+{n}" for o, n in rs[:3]) + (f", … ({len(rs)} ranges)" if len(rs) > 3 else "")
        rows.append([i + 1, r.get("file_id", ""), shown, int(r.get("bytes") or 0)])
    return rows


def privacy_html(result: dict, had_photo: bool, had_prompt: bool) -> str:
    sent = result.get("sent_to_server") or []
    files = sorted({r.get("file_id", "") for r in sent})
    total = sum(int(r.get("bytes") or 0) for r in sent)
    edit_bytes = int((result.get("summary") or {}).get("bytes") or 0)
    what = []
    if had_photo:
        what.append("your photo")
    if had_prompt:
        what.append("your instruction")
    kept = " and ".join(what) or "your input"
    extra = ""
    if total > edit_bytes:
        extra = (f" Of that, {edit_bytes / 1e6:.2f} MB streamed the cache for the edit; the rest is pack headers and, "
                 f"for this demo's quality comparison, the exact FP16 cache used to compute the reference output.")
    if result.get("pack_bytes_from") == "store":
        to, who = ("the template server and its object store (pack bytes come straight from the store, by presigned "
                   "URL)"), "the server and the store only learn"
    else:
        to, who = "the template server", "the server only learns"
    return (f'<div class="sk-privacy"><b>What left the device:</b> {len(sent)} requests to {to}, '
            f'naming only template files ({_esc(", ".join(files)) or "none"}) and byte ranges, '
            f'{total / 1e6:.2f} MB asked for in total.{extra} <b>{_esc(kept.capitalize())} never left the '
            f'device</b> (0 bytes): {who} which parts of which template were fetched.</div>')


def what_ran(name: str, fallbacks: list[dict]) -> str:
    """A system's label with what it fell back to: "FP16 → local at 0.42 s", "SAKURA (reused 3 shards,
    recomputed step 0)"; the plain label when nothing fired."""
    label = SYSTEM_TITLES.get(name, name)
    local = next((f for f in fallbacks if f["kind"] == "local"), None)
    reused = sum(f["kind"] == "reuse" for f in fallbacks)
    notes = ([f"reused {reused} shard{'s' * (reused != 1)}"] if reused else []) + (
        ["recomputed step 0"] if any(f["kind"] == "recompute" for f in fallbacks) else [])
    if notes:
        label += f" ({', '.join(notes)})"
    if local is not None:
        label += f" → local at {local['t']:.2f} s"
    return label


def machine_note(result: dict) -> str:
    """Why a real-clock latency may measure the machine rather than the system ("" when nothing says so):
    its compute outside the calibration's spread (busy), or a latency below the oracle's floor."""
    check = (result.get("summary") or {}).get("compute_check") or {}
    notes = []
    if check.get("busy"):
        why = "machine busy during the run" if check["ratio"] > 1 else "calibrated while the machine was busier"
        notes.append(f"{why}: compute {check['measured_s']:.2f} s vs {check['calibrated_s']:.2f} s calibrated "
                     f"({check['ratio']:.2f}×, beyond its ±{check['tolerance']:.0%})")
    if result.get("below_floor"):
        notes.append(f"below the oracle's floor ({result['below_floor']:.3f} s)")
    if notes and isinstance(result.get("sim_latency_s"), (int, float)):
        notes.append(f"simulated from the calibration: {result['sim_latency_s']:.3f} s"
                     + (" (without the prefetch)" if result.get("sim_without_prefetch") else ""))
    return "; ".join(notes)


def compare_rows(results: dict[str, dict], fallbacks: dict[str, list[dict]] | None = None) -> list[list]:
    """One row per system; ``fallbacks`` (per system, the timeline's) name what each one fell back to."""
    rows = []
    for sysname, res in results.items():
        s, m = res.get("summary") or {}, res.get("metrics") or {}
        fp16 = s.get("fp16_bytes") or 0
        check = s.get("compute_check") or {}
        compute = (f"{check['measured_s']:.2f} / {check['calibrated_s']:.2f}" if check
                   else f"— / {s['compute_s']:.2f}" if isinstance(s.get("compute_s"), (int, float)) else "")
        sim = res.get("sim_latency_s")
        rows.append([what_ran(sysname, (fallbacks or {}).get(sysname, [])), s.get("clock", ""),
                     round(s.get("latency_s") or 0, 3), round(sim, 3) if isinstance(sim, (int, float)) else "—",
                     round(s.get("stall_s") or 0, 3), round((s.get("bytes") or 0) / 1e6, 3),
                     f"{(s.get('bytes') or 0) / fp16:.1%}" if fp16 else "", compute,
                     *(round(m.get(k), 4) if isinstance(m.get(k), (int, float)) else None
                       for k in ("psnr", "ssim", "psnr_masked", "ssim_masked")), machine_note(res)])
    return rows


COMPARE_HEADERS = ["system", "clock", "latency s", "simulated s", "stall s", "MB sent", "vs FP16",
                   "compute s measured / calibrated", "PSNR", "SSIM", "PSNR masked", "SSIM masked", "note"]
PRIVACY_HEADERS = ["#", "file id", "byte ranges (offset+length)", "bytes"]




def backends_line(b: dict | None) -> str:
    """"ExecuTorch (XNNPACK) + OpenCL (…) on the host CPU" from a backends record (device protocol)."""
    if not b:
        return "unknown backends"
    return f"{b.get('executor_title', b.get('executor'))} + {b.get('reconstructor_title', b.get('reconstructor'))}"


def device_panel_html(device: dict | None, ran: dict | None = None, template: dict | None = None) -> str:
    """The device panel: what the device's edits run on (its configured stack), what the picked template will run
    on when it differs (an SD3 template runs eager), and what the last edit ran on — all on the host CPU."""
    rows = []
    if device:
        where = device.get("where", "host CPU")
        rows.append(f"<div><b>Executor:</b> <span id='sk-executor'>{_esc(device.get('executor_title'))}</span> · "
                    f"<b>Reconstructor:</b> <span id='sk-reconstructor'>{_esc(device.get('reconstructor_title'))}"
                    f"</span> — both run on the {_esc(where)} of this computer (no phone is attached; the stack is "
                    f"what a phone would run). Asked: <code>{_esc(device.get('asked', ''))}</code>.</div>")
        if device.get("note"):
            rows.append(f"<div class='sk-warn'>{_esc(device['note'])}</div>")
    planned = (template or {}).get("backends")
    if planned and device and planned.get("executor") != device.get("executor"):
        rows.append(f"<div class='sk-warn'>This template runs on {_esc(backends_line(planned))}: "
                    f"{_esc(planned.get('note') or '')}.</div>")
    if ran:
        local = ("" if ran.get("local_fallback", True) else
                 " The local fallback is off: the exported programs run fixed masked graphs.")
        note = f" ({_esc(ran['note'])})" if ran.get("note") else ""
        rows.append(f"<div id='sk-last-ran'><b>Last edit ran on:</b> {_esc(backends_line(ran))} on the "
                    f"{_esc(ran.get('where', 'host CPU'))}{note}.{local}</div>")
    if not rows:
        rows.append("<div>The device did not say which backends it runs.</div>")
    return f"<div class='sk-device-panel' id='sk-device-panel'><b>Device</b>{''.join(rows)}</div>"
