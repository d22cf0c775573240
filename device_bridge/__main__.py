"""``python -m device_bridge --listen HOST:PORT (--server URL | --packs DIR) [options]``: the device agent.

Prints ``sakura device agent listening on ws://HOST:PORT`` once bound (``--listen 127.0.0.1:0`` picks a
free port: the subprocess transport reads the URL from that line).
"""

from __future__ import annotations

import argparse
import sys

from device_bridge.agent import DEFAULT_TIMEOUT_S
from device_bridge.cli import run_agent
from sakura.process import sigterm_as_interrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m device_bridge", description="SAKURA device agent")
    ap.add_argument("--listen", default="127.0.0.1:8700", help="HOST:PORT to listen on (port 0 = any free port), or "
                    "unix:PATH (a Unix socket)")
    ap.add_argument("--kernel-ns", default=None, metavar="NAME", help="this agent runs inside the sakura network "
                    "namespace NAME: its edits' links are shaped there by tc, not paced (sakura demo --link kernel)")
    ap.add_argument("--server", default=None, help="template server URL (default: serve --packs locally)")
    ap.add_argument("--packs", default=None, help="packs folder to serve when no --server is given")
    ap.add_argument("--catalog", default=None, help="catalog manifest (TOML); default: the embedded one")
    ap.add_argument("--link", choices=("ws", "http"), default="ws", help="how the device fetches cache ranges")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds a shard may be late before the edit fails")
    ap.add_argument("--warmup", action="append", default=[], metavar="TEMPLATE",
                    help="load the model and calibrate compute for this template before serving")
    ap.add_argument("--calibration", default=None, metavar="FILE",
                    help="JSON file keeping measured device compute across restarts")
    ap.add_argument("--calibration-repeats", type=int, default=1, metavar="N",
                    help="masked runs per template calibration (local runs: N − 1, their spread judged from 2)")
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--executor", choices=("eager", "executorch", "qnn", "auto"), default="eager",
                    help="how shards execute (auto: executorch where it runs here)")
    ap.add_argument("--reconstructor", choices=("torch", "opencl", "auto"), default="torch",
                    help="how K/V are rebuilt (auto: opencl where a device exists)")
    ap.add_argument("--programs", default=None, metavar="DIR", help="folder of exported shard programs")
    a = ap.parse_args(argv)
    sigterm_as_interrupt()  # SIGTERM cleans up (the local template server) as Ctrl-C does
    try:
        run_agent(a.listen, a.server, a.packs, catalog=a.catalog, link=a.link, timeout_s=a.timeout,
                  warmup=a.warmup, calibration_file=a.calibration, calibration_repeats=a.calibration_repeats,
                  log_level=a.log_level, executor=a.executor, reconstructor=a.reconstructor, programs=a.programs,
                  kernel_ns=a.kernel_ns)
    except KeyboardInterrupt:
        return 0
    except (ValueError, RuntimeError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
