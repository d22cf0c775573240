"""What a transfer reads on the kernel link for each token-bucket size: a 12 kB body after 0.3 s idle (twice), 54 kB
and 1 MB, each on a fresh connection, timed in this process (inside the namespace) from request to last byte.

    python docs/results/issue35/burst/burst.py --bursts 32kb,8kb,3kb,1600 --rates 3.67,12     # (root)
"""

import argparse
import http.client
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
from test_kernel_link import serve_inside  # noqa: E402  (the tests' server inside a namespace)

from sakura.net import kernel  # noqa: E402

SIZES = (12_000, 12_000, 54_000, 1_000_000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bursts", default="32kb,8kb,3kb,1600")
    ap.add_argument("--rates", default="3.67,12")
    a = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(0)
    for n in set(SIZES):
        (folder / f"b{n}").write_bytes(rng.bytes(n))
    print("| burst | rate (Mbit/s) | " + " | ".join(f"{n / 1e3:.0f} kB (Mbit/s)" for n in SIZES) + " |")
    print("|---|---|" + "---|" * len(SIZES))
    with kernel.create_namespace(10) as ns:
        srv = serve_inside(ns, folder)
        try:
            with kernel.entered(ns):
                for burst in a.bursts.split(","):
                    for rate in map(float, a.rates.split(",")):
                        ns.run(["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{rate * 1000:.0f}kbit",
                                "burst", burst, "latency", kernel.LATENCY], check=True)
                        read = []
                        for n in SIZES:
                            time.sleep(0.3)  # the bucket fills while the link is idle
                            c = http.client.HTTPConnection("127.0.0.1", 8765)
                            c.connect()
                            t0 = time.monotonic()
                            c.request("GET", f"/b{n}")
                            c.getresponse().read()
                            read.append(n * 8 / 1e6 / (time.monotonic() - t0))
                            c.close()
                        print(f"| {burst} | {rate:g} | " + " | ".join(f"{r:.2f}" for r in read) + " |", flush=True)
        finally:
            srv.kill()


if __name__ == "__main__":
    main()
