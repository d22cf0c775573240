"""The edit page's network inputs, checked once on the app side (the device never re-parses them)."""

from __future__ import annotations

from app.images import UploadError
from device_bridge import EditRejected, NetworkSpec, TraceUpload


def check_trace_upload(path: str | None) -> TraceUpload:
    """Validate an uploaded trace once → its samples; raises :class:`UploadError` with a friendly line."""
    if not path:
        raise UploadError("Please choose a trace file (CSV `time_s,mbps` or two columns `time Mbps`).")
    try:
        return TraceUpload.from_file(path)
    except EditRejected as e:
        raise UploadError(f"That trace file cannot be used: {e}. Expected CSV with header `time_s,mbps`, "
                          "or two whitespace-separated columns `time throughput_mbps`.") from None


def network_spec(choice: str, fixed_mbps, trace_upload: TraceUpload | None, start, paper_regime: bool) -> NetworkSpec:
    regime = "paper" if paper_regime else "none"
    if choice == "fixed":
        try:
            mbps = float(fixed_mbps)
        except (TypeError, ValueError):
            raise UploadError("Please give the fixed link rate in Mbps (a number > 0).") from None
        if not 0 < mbps <= 1e6:
            raise UploadError("The fixed link rate must be between 0 and 1,000,000 Mbps.")
        trace, regime, upload = f"fixed:{mbps:g}", "none", None  # a fixed link runs as given, unscaled
    elif choice == "upload":
        if not trace_upload:
            raise UploadError("Please upload a trace file first (or pick another network).")
        trace, upload = trace_upload.name, trace_upload
    elif choice in ("5g", "4g5g", "wifi"):
        trace, upload = choice, None
    else:
        raise UploadError("Please pick a network.")
    return NetworkSpec(trace, _start(start), None, regime, upload)


def _start(start) -> float | None:
    if start is None or str(start).strip().lower() in ("", "random"):
        return None
    try:
        value = float(start)
    except (TypeError, ValueError):
        raise UploadError("The trace start must be a number of seconds (or empty for a random start).") from None
    if value < 0:
        raise UploadError("The trace start must be ≥ 0 seconds.")
    return value
