"""How closely the emulated links follow their traces, and what a keep-alive range request costs: what the
tests once asserted as wall-clock bounds (they now only check "never faster than the trace" and "no hang",
which hold on a busy machine). Run it on a quiet machine::

    python -m sakura.eval.pacing_bench [--repeats 5] [--json out.json]

Rows: the sender-side shaper (``TraceShaper``, fixed 80 Mbps and a 5G stretch), the template server's shaped
HTTP response, the device-side ``PacedLink``; each as measured time / trace time (1.00 = exact; the bucket's
first 16 KiB leave at once). Then the fastest of five keep-alive range requests to a server process (a Nagle /
delayed-ACK stall would be ~40 ms). The 1-minute load per core is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from sakura.net.byteranges import Transfer
from sakura.net.clock import RealClock
from sakura.net.paced import PacedLink
from sakura.net.shaping import BUCKET_BYTES, TraceShaper
from sakura.net.traces import Trace, load_trace, synthetic
from sakura.server import start_server


def shaper_ratio(trace: Trace, start: float, n: int) -> float:
    shaper = TraceShaper(trace, start, RealClock())
    t = time.monotonic()
    sum(len(c) for c in shaper.send_chunks(bytes(n)))
    return (time.monotonic() - t) / trace.time_to_send(n - BUCKET_BYTES, start)


def paced_link_ratio(n: int = 200_000) -> float:
    class Instant:
        def fetch_timed(self, fid, ranges):
            now = time.monotonic()
            size = sum(k for _, k in ranges)
            return Transfer([b"\0" * k for _, k in ranges], size, size, now, now, now)

    trace = Trace.constant(8.0)
    link = PacedLink(Instant(), trace, 0.0)
    t = time.monotonic()
    link.fetch_timed("x", [(0, n)])
    return (time.monotonic() - t) / trace.time_to_send(n, 0.0)


def server_rows(repeats: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "blob.pack").write_bytes(np.random.default_rng(0).bytes(2_000_000))
        with start_server(d, process=True) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            n = 2_000_000
            expected = (n - BUCKET_BYTES) * 8 / 40e6
            shaped, keepalive = [], []
            for _ in range(repeats):
                t = time.monotonic()
                c.get("/packs/blob", headers={"Range": f"bytes=0-{n - 1}", "X-Sakura-Trace": "fixed:40"})
                shaped.append((time.monotonic() - t) / expected)
                took = []
                for _ in range(5):
                    t = time.monotonic()
                    c.get("/packs/blob", headers={"Range": "bytes=0-9"})
                    took.append(time.monotonic() - t)
                keepalive.append(min(took) * 1e3)
    return {"server HTTP, fixed 40 Mbps (measured / trace)": shaped, "keep-alive range request, fastest of 5 (ms)":
            keepalive}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sakura.eval.pacing_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows: dict[str, list[float]] = {
        "TraceShaper, fixed 80 Mbps (measured / trace)": [shaper_ratio(load_trace("fixed:80"), 0.0, 2_000_000)
                                                          for _ in range(args.repeats)],
        "TraceShaper, 5G x0.1 from 30 s (measured / trace)": [shaper_ratio(synthetic("5g").scaled(0.1), 30.0,
                                                                            3_000_000) for _ in range(args.repeats)],
        "PacedLink, 8 Mbps (measured / trace)": [paced_link_ratio() for _ in range(args.repeats)],
    } | server_rows(args.repeats)
    load = round(os.getloadavg()[0] / (os.cpu_count() or 1), 2)
    print(f"load per core {load}; {args.repeats} repeats: median [min, max]")
    for name, xs in rows.items():
        print(f"  {name:55s} {statistics.median(xs):7.3f} [{min(xs):.3f}, {max(xs):.3f}]")
    if args.json:
        args.json.write_text(json.dumps({"load_per_core": load, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
