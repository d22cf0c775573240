"""``python -m sakura.server --packs DIR [--host H] [--port P] [--access-log FILE] [--trace-dir DIR]``."""

from __future__ import annotations

import argparse

from sakura.server.run import serve


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sakura.server", description="SAKURA template server")
    ap.add_argument("--packs", required=True, help="directory of <file_id>.pack files")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8600)
    ap.add_argument("--access-log", default=None, help="file for the JSON-lines access log")
    ap.add_argument("--trace-dir", default=None, help="trace files clients may name in X-Sakura-Trace")
    ap.add_argument("--log-level", default="warning")
    a = ap.parse_args(argv)
    serve(a.packs, a.host, a.port, access_log=a.access_log, trace_dir=a.trace_dir, log_level=a.log_level)


if __name__ == "__main__":
    main()
