"""Prefetch on template pick, on the device: the pack starts moving while the person picks a photo.

Picking a template reveals nothing private: the prefetch asks the template server for that template's
file ids and byte ranges only, exactly what the edit would ask for. It runs in a background thread over
the device's own paced link (the network chosen when the template was picked) until the edit starts;
the edit then takes what arrived whole (:mod:`sakura.runtime.prefetch`) and continues on the same link
from where the prefetch left it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from sakura.net.paced import LinkClosed, PacedLink
from sakura.net.refs import resolving
from sakura.runtime.prefetch import Prefetched, PrefetchStore, prefetch_over
from sakura.runtime.session import DeviceRuntime, Network

log = logging.getLogger("device_bridge")

DEFAULT_THINK_S = 4.0  # what a person needs to pick a photo or type a prompt (sizes the prefetch level)


@dataclass
class _Running:
    template_id: str
    trace_start: float  # where in the trace the prefetch began
    t0: float  # monotonic start
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    error: str | None = None


class Prefetcher:
    """One prefetch at a time: a new pick stops the previous one (its bytes stay in the store)."""

    def __init__(self, runtime: DeviceRuntime, make_client, store: PrefetchStore | None = None) -> None:
        self.runtime, self.make_client = runtime, make_client
        self.store = store or PrefetchStore()
        self._running: _Running | None = None
        self._lock = threading.Lock()

    def start(self, template, network: Network, think_s: float = DEFAULT_THINK_S) -> dict:
        """Begin prefetching ``template``'s SAKURA pack over ``network``; returns at once."""
        self.stop()
        session = self.runtime.session(template, "sakura", network)
        run = _Running(template.id, session.start, time.monotonic())
        run.thread = threading.Thread(target=self._fetch, args=(run, session, think_s), name="prefetch", daemon=True)
        with self._lock:
            self._running = run
        run.thread.start()
        return {"template_id": template.id, "trace_start": session.start, "think_s": think_s,
                "held": self.store.get(template.id).summary() if template.id in self.store else None}

    def _fetch(self, run: _Running, session, think_s: float) -> None:
        client = self.make_client()
        link = PacedLink(resolving(client, session.file_id, session.encoding), session.trace, session.start)
        try:
            held = prefetch_over(link, session.encoding, session.file_id, run.template_id, think_s,
                                 session.initial_bps, run.stop)
            self.store.put(held)
        except LinkClosed:
            pass
        except Exception as e:  # noqa: BLE001 - a failed prefetch costs nothing: the edit streams it all
            run.error = f"{type(e).__name__}: {e}"
            log.info("prefetch of %s failed: %s", run.template_id, run.error)
        finally:
            link.close()
            client.close()

    def stop(self) -> _Running | None:
        with self._lock:
            run, self._running = self._running, None
        if run is not None:
            run.stop.set()
            if run.thread is not None:
                run.thread.join(timeout=5)
        return run

    def take(self, template_id: str) -> tuple[Prefetched | None, float | None]:
        """Stop prefetching; what is held for ``template_id``, and where in the trace the edit goes on
        (None: not prefetched during this pick)."""
        run = self.stop()
        held = self.store.get(template_id)
        if run is None or run.template_id != template_id:
            return held, None
        return held, run.trace_start + (time.monotonic() - run.t0)
