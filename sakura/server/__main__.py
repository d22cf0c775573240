"""``python -m sakura.server --packs DIR [--host H] [--port P] [--access-log FILE] [--trace-dir DIR] [limits]``."""

from __future__ import annotations

import argparse

from sakura.server.limits import ServerLimits
from sakura.server.run import serve


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sakura.server", description="SAKURA template server")
    ap.add_argument("--packs", required=True, help="directory of <file_id>.pack files")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8600)
    ap.add_argument("--access-log", default=None, help="file for the JSON-lines access log")
    ap.add_argument("--trace-dir", default=None, help="trace files clients may name in X-Sakura-Trace")
    ap.add_argument("--log-level", default="warning")
    d = ServerLimits()
    ap.add_argument("--max-connections", type=int, default=d.max_connections, help="open connections (503 beyond)")
    ap.add_argument("--header-timeout", type=float, default=d.header_timeout_s, help="seconds to send a request head")
    ap.add_argument("--send-stall-timeout", type=float, default=d.send_stall_s,
                    help="seconds a client may read nothing before it is dropped")
    a = ap.parse_args(argv)
    limits = ServerLimits(max_connections=a.max_connections, header_timeout_s=a.header_timeout,
                          send_stall_s=a.send_stall_timeout)
    serve(a.packs, a.host, a.port, access_log=a.access_log, trace_dir=a.trace_dir, log_level=a.log_level,
          limits=limits)


if __name__ == "__main__":
    main()
