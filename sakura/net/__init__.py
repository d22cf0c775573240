"""Links: bandwidth traces, trace-following rate shaping, clocks, range clients.

``sakura.net.client`` (HTTP / websocket range clients) is imported explicitly, so code that
only needs traces does not load httpx and websockets.
"""

from sakura.net.clock import Clock, RealClock, SimClock
from sakura.net.shaping import RateSpec, TraceShaper
from sakura.net.traces import Trace, TraceError, load_trace, paper_regime_scale, read_trace_file, synthetic

__all__ = [
    "Clock", "RealClock", "SimClock", "RateSpec", "TraceShaper",
    "Trace", "TraceError", "load_trace", "paper_regime_scale", "read_trace_file", "synthetic",
]
