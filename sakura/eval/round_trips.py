"""A template server process to measure against: warm its files, and the request round trip the simulated
clock charges (measured once per machine, kept with the calibration)."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from sakura.formats import file_id
from sakura.net.store_reader import link_for_server
from sakura.net.stores import open_store
from sakura.runtime.calibration import CalibrationStore
from sakura.server.run import start_server
from sakura.systems import STREAMING


def warm(client, template_id: str, formats=("fp16", *STREAMING)) -> None:
    """One tiny range of each file first: a server's first range request per file is slow (lazy
    open), which timed transfers should not measure."""
    for fmt in formats:
        client.fetch(file_id(template_id, fmt), [(0, 8)])


def measure_round_trips(packs: Path, template_ids: list[str], store: CalibrationStore, requests: int = 60) -> float:
    """Request → first byte of shard-sized range requests to a template server process over real
    sockets (after a warm-up per file); kept in ``store``. Returns the median in seconds."""
    rng = np.random.default_rng(0)
    samples: list[float] = []
    with start_server(packs, port=0, process=True) as srv, link_for_server(srv.url) as client:
        fids = [file_id(t, "sakura") for t in template_ids]
        pack_store = open_store(packs)
        sizes = {f: pack_store.size(f) for f in fids}
        for t in template_ids:
            warm(client, t, ("sakura",))
        for k in range(requests):
            f = fids[k % len(fids)]
            n = int(rng.integers(10_000, 600_000))
            tr = client.fetch_timed(f, [(int(rng.integers(0, max(1, sizes[f] - n))), n)])
            samples.append(max(0.0, tr.t_first_byte - tr.t_request))
    store.record_round_trips(samples)
    return statistics.median(samples)
