"""The device side of SAKURA: an agent that owns request-specific inference, and transports to it.

The app talks to a device only through :func:`connect` (in-process, local subprocess, websocket
to another host, adb to a phone) with the typed protocol of :mod:`device_bridge.protocol`; the wire
format is in ``docs/device-protocol.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The names below are imported on first use (PEP 562), not with the package: `sakura` loads its `device`
# command from device_bridge.cli in every process (`sakura --help` included), and the agent behind these
# names imports the model code (torch, diffusers: seconds).
_SOURCES = {
    "DeviceAgent": "device_bridge.agent",
    **dict.fromkeys(("COMPRESSED", "FLOOR", "OURS", "PROTOCOL_VERSION", "SYSTEMS", "EditFailed", "EditProgress",
                     "EditRejected", "Job", "NetworkSpec", "Photo", "TraceUpload"), "device_bridge.protocol"),
    **dict.fromkeys(("AdbBridge", "Bridge", "BridgeError", "InProcessBridge", "SubprocessBridge", "WsBridge",
                     "connect", "preflight"), "device_bridge.transport"),
}

if TYPE_CHECKING:
    from device_bridge.agent import DeviceAgent
    from device_bridge.protocol import (
        COMPRESSED,
        FLOOR,
        OURS,
        PROTOCOL_VERSION,
        SYSTEMS,
        EditFailed,
        EditProgress,
        EditRejected,
        Job,
        NetworkSpec,
        Photo,
        TraceUpload,
    )
    from device_bridge.transport import (
        AdbBridge,
        Bridge,
        BridgeError,
        InProcessBridge,
        SubprocessBridge,
        WsBridge,
        connect,
        preflight,
    )


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_SOURCES[name]), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))


__all__ = [
    "COMPRESSED",
    "AdbBridge",
    "Bridge",
    "BridgeError",
    "DeviceAgent",
    "EditFailed",
    "EditProgress",
    "EditRejected",
    "InProcessBridge",
    "Job",
    "NetworkSpec",
    "FLOOR",
    "OURS",
    "PROTOCOL_VERSION",
    "Photo",
    "SYSTEMS",
    "SubprocessBridge",
    "TraceUpload",
    "WsBridge",
    "connect",
    "preflight",
]
