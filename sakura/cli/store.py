"""`sakura store`: a local S3 object store (SeaweedFS) for packs, in the foreground until Ctrl-C; and
`sakura store gc URL`: delete the objects no published index references (:mod:`sakura.net.store_gc`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from sakura.cli.errors import friendly

store_app = typer.Typer(invoke_without_command=True, add_completion=False, pretty_exceptions_enable=False,
                        help="Run a local S3 object store for packs (default), or collect an S3 store's garbage (gc).")


@store_app.callback()
@friendly
def store_cmd(
    ctx: typer.Context,
    data_dir: Path = typer.Option(Path(".sakura-store"), "--dir", help="Where the store keeps its data."),
    port: int = typer.Option(8333, "--port", help="S3 port on 127.0.0.1 (0: any free port)."),
    bucket: str = typer.Option("packs", "--bucket", help="Bucket to create (if missing)."),
    access_key: str = typer.Option("sakura", "--access-key"),
    secret_key: str = typer.Option("sakura-secret", "--secret-key"),
):
    """Run a local S3 object store (SeaweedFS on loopback) and print how to point sakura at it."""
    if ctx.invoked_subcommand is not None:
        return
    import signal

    from sakura.net.seaweed import start_local_s3  # sakura --help stays light

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


@store_app.command("gc")
@friendly
def gc_cmd(
    url: str = typer.Argument(..., help="The pack store, s3://bucket/prefix (endpoint and credentials from AWS_*)."),
    grace: float = typer.Option(3600.0, "--grace", help="Keep unreferenced objects younger than this many seconds "
                                "(an in-flight build's writes before it publishes)."),
    yes: bool = typer.Option(False, "--yes", help="Delete (default: a dry run that lists what would go)."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Delete content-addressed objects that no published template index references (dry run unless --yes)."""
    from sakura.net.store_gc import collect  # sakura --help stays light
    from sakura.net.stores import open_store  # sakura --help stays light

    report = collect(open_store(url), grace_s=grace, delete=yes)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=1))
        return
    verb = "deleted" if yes else "would delete"
    for key in report.garbage:
        typer.echo(f"{verb} {key}")
    typer.echo(f"{report.store}: {report.referenced} objects referenced by published indexes, {len(report.young)} "
               f"unreferenced but younger than {grace:g} s (kept); {verb} {len(report.garbage)} objects "
               f"({report.garbage_bytes / 1e6:.1f} MB)" + ("" if yes else ". Run again with --yes to delete them."))
