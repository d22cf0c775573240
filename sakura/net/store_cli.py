"""`sakura store`: a local S3 object store (SeaweedFS) for packs, in the foreground until Ctrl-C."""

from __future__ import annotations

import time
from pathlib import Path

import typer


def store_cmd(
    data_dir: Path = typer.Option(Path(".sakura-store"), "--dir", help="Where the store keeps its data."),
    port: int = typer.Option(8333, "--port", help="S3 port on 127.0.0.1 (0: any free port)."),
    bucket: str = typer.Option("packs", "--bucket", help="Bucket to create (if missing)."),
    access_key: str = typer.Option("sakura", "--access-key"),
    secret_key: str = typer.Option("sakura-secret", "--secret-key"),
):
    """Run a local S3 object store (SeaweedFS on loopback) and print how to point sakura at it."""
    import signal

    from sakura.net.seaweed import start_local_s3

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the store as Ctrl-C does
    with start_local_s3(data_dir, s3_port=port, access_key=access_key, secret_key=secret_key) as s3:
        client = s3.client()
        if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=bucket)
        typer.echo(f"S3 endpoint {s3.endpoint} (SeaweedFS, data in {data_dir}); bucket s3://{bucket}")
        typer.echo("point sakura (and any S3 client) at it with:")
        for name, value in s3.env().items():
            typer.echo(f"  export {name}={value}")
        typer.echo(f"then: sakura build --out s3://{bucket}/catalog   and   sakura serve --packs s3://{bucket}/catalog",
                   err=False)
        try:
            while s3.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            typer.echo("stopping the store")
        else:
            raise typer.Exit(1)
