"""The device side of SAKURA: an agent that owns request-specific inference, and transports to it.

The app talks to a device only through :func:`connect` (in-process, local subprocess, websocket
to another host, adb to a phone) with the typed protocol of :mod:`device_bridge.protocol`; the wire
format is in ``docs/device-protocol.md``.
"""

from device_bridge.agent import DeviceAgent
from device_bridge.protocol import (COMPRESSED, PROTOCOL_VERSION, SYSTEMS, EditFailed, EditProgress, EditRejected, Job, NetworkSpec,
                                    Photo, TraceUpload)
from device_bridge.transport import (AdbBridge, Bridge, BridgeError, InProcessBridge, SubprocessBridge, WsBridge,
                                     connect)

__all__ = ["COMPRESSED", "AdbBridge", "Bridge", "BridgeError", "DeviceAgent", "EditFailed", "EditProgress", "EditRejected",
           "InProcessBridge", "Job", "NetworkSpec", "PROTOCOL_VERSION", "Photo", "SYSTEMS", "SubprocessBridge",
           "TraceUpload", "WsBridge", "connect"]
