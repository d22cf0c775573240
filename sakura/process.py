"""Process lifetime: SIGTERM stops a long-running command the way Ctrl-C does.

systemd, docker and ``kill`` send SIGTERM. Python's default for it ends the process at once, skipping
every ``finally`` and context manager, so a command that started a child (the demo's template server,
the agent's local server) left it running with parent PID 1. uvicorn's ``Server.run`` catches SIGTERM
for a graceful stop and then raises it again under the handler that was there before: this one.
"""

from __future__ import annotations

import signal
import threading


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def sigterm_as_interrupt() -> None:
    """From now on SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does (a no-op elsewhere:
    only the main thread may set handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
