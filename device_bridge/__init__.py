"""The device side of SAKURA: an agent that owns request-specific inference, and transports to it.

The app talks to a device only through :func:`connect` (in-process, local subprocess, websocket
to another host, adb to a phone); the wire protocol is in ``docs/device-protocol.md``.
Imports are light: torch loads only when an edit runs.
"""

from device_bridge.agent import PROTOCOL_VERSION, SYSTEMS, DeviceAgent, EditFailed, EditRejected
from device_bridge.transport import (AdbBridge, Bridge, BridgeError, InProcessBridge, SubprocessBridge, WsBridge,
                                     connect)

__all__ = ["AdbBridge", "Bridge", "BridgeError", "DeviceAgent", "EditFailed", "EditRejected", "InProcessBridge",
           "PROTOCOL_VERSION", "SYSTEMS", "SubprocessBridge", "WsBridge", "connect"]
