"""The app's only way to the device: a :mod:`device_bridge` bridge, plus a helper that turns a
blocking ``bridge.edit(job, on_event)`` into an iterator of events (for Gradio generators).
System names and labels come from the one registry, through the protocol."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from device_bridge import SYSTEMS, Bridge, BridgeError, EditFailed, EditRejected, Job

SYSTEM_TITLES = {name: s.title for name, s in SYSTEMS.items()}  # the app's longer labels
COMPARE_ORDER = tuple(SYSTEMS)  # "Compare all" runs every system, in the registry's order


class EditProblem(Exception):
    """An edit that did not finish; ``friendly`` is the line for the page, ``user_fixable`` says
    whether it was the input (a warning) or the system (an error box)."""

    def __init__(self, friendly: str, user_fixable: bool = False):
        super().__init__(friendly)
        self.friendly, self.user_fixable = friendly, user_fixable


@dataclass
class EditRun:
    """One edit in a worker thread; iterate :meth:`events` for what happens, read ``result``/``problem``."""

    bridge: Bridge
    job: Job
    result: dict | None = None
    problem: EditProblem | None = None
    _q: queue.Queue = field(default_factory=queue.Queue)

    def start(self) -> "EditRun":
        threading.Thread(target=self._work, daemon=True, name="edit").start()
        return self

    def _work(self) -> None:
        try:
            self.result = self.bridge.edit(self.job, on_event=self._q.put)
        except EditRejected as e:
            self.problem = EditProblem(str(e), user_fixable=True)
        except EditFailed as e:
            self.problem = EditProblem(f"The edit could not finish: {e}")
        except BridgeError as e:
            self.problem = EditProblem(f"The device is not reachable: {e}")
        except Exception as e:  # noqa: BLE001 - never a traceback in the page
            self.problem = EditProblem(
                f"The edit failed unexpectedly ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            )
        finally:
            self._q.put(None)

    def events(self, batch_s: float = 0.25, heartbeat_s: float = 1.0) -> Iterator[list[dict]]:
        """Batches of events until the edit ends. A batch holds the first event after a wait and what came
        within ``batch_s`` of it (a page redraws per batch: a burst is one redraw, silence none); it is
        cut short by an event the page shows at once (the output, the result, an error) and by the edit's
        end; an empty batch is a heartbeat after ``heartbeat_s`` of silence."""
        done = False
        while not done:
            batch: list[dict] = []
            try:
                first = self._q.get(timeout=heartbeat_s)
            except queue.Empty:
                yield batch
                continue
            deadline = time.monotonic() + batch_s
            ev = first
            while True:
                if ev is None:
                    done = True
                    break
                batch.append(ev)
                if ev.get("type") in ("output", "result", "error"):  # what the page shows at once
                    break
                try:
                    ev = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
            yield batch


def templates_of(bridge: Bridge) -> list[dict]:
    try:
        return bridge.templates()
    except Exception as e:  # noqa: BLE001
        raise EditProblem(f"Cannot list templates from the device: {' '.join(str(e).split())[:200]}") from None
