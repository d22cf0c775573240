"""RangeClient against a real nginx serving the pack directory (Debian package ``nginx``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sakura.net.client import RangeClient

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
)  # /usr/sbin is not on every user's PATH
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed (Debian: apt-get install -y nginx)")

SIZE = 1_500_000

CONF = """
# A throwaway nginx: foreground, one process as the current user, everything under {tmp}.
daemon off;
master_process off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location /norange/ {{ alias {root}/; max_ranges 0; }}   # a server that ignores Range
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, bytes]]:
    tmp = tmp_path_factory.mktemp("nginx")
    root = tmp / "packs"
    root.mkdir()
    data = np.random.default_rng(3).bytes(SIZE)
    (root / "tpl.pack").write_bytes(data)
    head = b'{"units": [4, 5]}'
    (root / "hdr.pack").write_bytes(len(head).to_bytes(8, "little") + head + b"payload")
    port = _free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(CONF.format(tmp=tmp, root=root, port=port))
    # -e: error log before the config is read (the default /var/log/nginx may not be writable).
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.communicate()[0].decode(errors="replace")
                log = (tmp / "error.log").read_text() if (tmp / "error.log").exists() else ""
                pytest.fail(f"nginx did not start: {out} {log}")
            time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", data
    proc.terminate()
    proc.wait(10)


def test_multi_range_fetch_from_nginx(nginx: tuple[str, bytes]) -> None:
    url, data = nginx
    ranges = [(0, 8), (1000, 5000), (700_000, 123_456), (SIZE - 10, 10), (5, 10), (200, 0)]
    with RangeClient(url, pack_path="/{id}.pack") as c:
        tr = c.fetch_timed("tpl", ranges)
        assert tr.parts == [data[o : o + n] for o, n in ranges]
        assert tr.wire_bytes < SIZE  # real ranges came back, not the whole file
        assert c.fetch("tpl", [(10, 20)]) == [data[10:30]]  # single range -> plain 206
        assert c.header("hdr") == {"units": [4, 5]}  # no /header endpoint: read via ranges


def test_server_ignoring_ranges_still_works(nginx: tuple[str, bytes]) -> None:
    url, data = nginx
    with RangeClient(url, pack_path="/norange/{id}.pack") as c:
        tr = c.fetch_timed("tpl", [(0, 8), (9000, 100)])
    assert tr.parts == [data[:8], data[9000:9100]] and tr.wire_bytes == SIZE
