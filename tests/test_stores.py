"""Pack stores by URL (sakura.net.stores): a folder and a real S3 store (SeaweedFS), the device reading
ranges straight from the store (one Range per request) and the template server in store mode."""

from __future__ import annotations

import hashlib
import shutil

import httpx
import pytest

from sakura.formats import FORMATS, file_id
from sakura.net.client import FetchError, RangeClient
from sakura.net.store_reader import ServerStoreClient, link_for_server
from sakura.net.stores import FolderStore, StoreError, open_store
from sakura.server.run import start_server

KEY = "k" * 32


def stage_copy(packs, template_id, tmp_path):
    """A staged build of one template: copies of its built files."""
    staged = tmp_path / f"staged-{template_id}"
    staged.mkdir()
    for name in FORMATS:
        fid = file_id(template_id, name)
        shutil.copy(packs / f"{fid}.pack", staged / f"{fid}.pack")
    (staged / f"{template_id}.build.json").write_text("{}")
    return staged


@pytest.fixture(scope="module")
def published(s3, fs_packs, tmp_path_factory):
    packs, tpl = fs_packs
    store = open_store(s3.url("stores"), create=True)
    store.publish(tpl.id, stage_copy(packs, tpl.id, tmp_path_factory.mktemp("stage")), KEY)
    return store, packs, tpl


def test_s3_store_reads_the_published_bytes(published):
    store, packs, tpl = published
    fid = file_id(tpl.id, "sakura")
    raw = (packs / f"{fid}.pack").read_bytes()
    assert store.size(fid) == len(raw)
    assert store.read(fid, 100, 1000) == raw[100:1100]
    assert store.published_key(tpl.id) == KEY and store.has_build(tpl.id, KEY)
    assert set(store.templates()[tpl.id]["files"]) == {file_id(tpl.id, n) for n in FORMATS}
    # content-addressed: the object key carries the hash of the bytes
    assert hashlib.sha256(raw).hexdigest()[:24] in store.locate(fid)["key"]


def test_device_reads_ranges_from_presigned_urls_one_range_per_request(published):
    store, packs, tpl = published
    fid = file_id(tpl.id, "fp16")
    raw = (packs / f"{fid}.pack").read_bytes()
    with store.source() as source:
        assert source.header_bytes(fid) == raw[:8 + int.from_bytes(raw[:8], "little")]
        ranges = [(10, 5), (15, 20), (5000, 100), (len(raw) - 7, 7)]
        tr = source.fetch_timed(fid, ranges)
        assert tr.parts == [raw[o:o + n] for o, n in ranges]
        assert tr.wire_bytes == 25 + 100 + 7  # adjacent ranges coalesced; nothing else fetched
        with pytest.raises(FetchError) as e:
            source.fetch(fid, [(len(raw) - 1, 2)])
        assert e.value.status == 416


def test_store_mode_server_gives_catalog_headers_and_presigned_urls(published):
    store, packs, tpl = published
    fid = file_id(tpl.id, "sakura")
    raw = (packs / f"{fid}.pack").read_bytes()
    with start_server(store.url, port=0) as srv:
        with ServerStoreClient(srv.url) as client:
            assert {t["id"] for t in client.templates()} >= {fid}
            assert client.header_bytes(fid) == raw[:8 + int.from_bytes(raw[:8], "little")]
            assert client.fetch(fid, [(3, 9)]) == [raw[3:12]]
            with pytest.raises(FetchError) as e:
                client.fetch("no-such-template", [(0, 8)])
            assert e.value.status == 404
        assert isinstance(link_for_server(srv.url), ServerStoreClient)
        # a plain client that follows redirects gets the bytes from the store
        r = httpx.get(f"{srv.url}/packs/{fid}", headers={"Range": "bytes=0-7"}, follow_redirects=True)
        assert r.status_code == 206 and r.content == raw[:8]
        assert httpx.get(f"{srv.url}/packs/..%2Fx/url").status_code in (400, 404)


def test_folder_store_publishes_and_keeps_the_servers_layout(fs_packs, tmp_path):
    packs, tpl = fs_packs
    store = open_store(tmp_path / "folder", create=True)
    assert isinstance(store, FolderStore) and store.published_key(tpl.id) is None
    store.publish(tpl.id, stage_copy(packs, tpl.id, tmp_path), KEY)
    assert store.published_key(tpl.id) == KEY
    fid = file_id(tpl.id, "sakura")
    assert (tmp_path / "folder" / f"{fid}.pack").read_bytes() == (packs / f"{fid}.pack").read_bytes()
    with start_server(tmp_path / "folder", port=0) as srv:
        assert isinstance(link_for_server(srv.url), RangeClient)


def test_bad_store_urls_and_credentials_fail_clearly(s3, monkeypatch):
    with pytest.raises(StoreError, match="unknown pack store"):
        open_store("gs://bucket/x")
    with pytest.raises(StoreError, match="bad store URL"):
        open_store("s3:///prefix")
    with pytest.raises(StoreError, match="unknown bucket"):
        open_store(s3.bucket_url + "-missing/x")
    with pytest.raises(StoreError, match="does not exist"):
        open_store("/nonexistent/sakura-packs")
    store = open_store(s3.url("empty"))
    with pytest.raises(FetchError) as e:
        store.read("fs-nothing", 0, 8)
    assert e.value.status == 404
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StoreError, match="refused these credentials"):
        open_store(s3.url("x"))


def test_a_ray_address_nothing_answers_at_fails_at_once():
    import time

    from sakura.net.seaweed import free_port
    from sakura.offline.ray_build import RayUnavailable, check_reachable

    t0 = time.monotonic()
    with pytest.raises(RayUnavailable, match="no Ray cluster answers"):
        check_reachable(f"127.0.0.1:{free_port()}")
    assert time.monotonic() - t0 < 30  # an unreachable address fails fast, not after a long connect timeout


def test_build_into_a_folder_store_publishes_then_skips_the_same_build(tmp_path):
    from types import SimpleNamespace

    from sakura.catalog import load_catalog
    from sakura.offline.publish import BuildSettings, build_into_store

    built = []

    def fake_build(template, out_dir, *, progress=None, **kw):  # dummy files: publishing is what is tested
        built.append(template.id)
        for name in FORMATS:
            (out_dir / f"{file_id(template.id, name)}.pack").write_bytes(b"x" * 16)
        (out_dir / f"{template.id}.build.json").write_text("{}")
        return SimpleNamespace(storage={"sakura": 16}, fp16_bytes=16)

    tpl = load_catalog().get("fs-astronaut")
    store = open_store(tmp_path / "packs", create=True)
    first = build_into_store(tpl, store, BuildSettings(max_rank=8), build=fake_build)
    again = build_into_store(tpl, store, BuildSettings(max_rank=8), build=fake_build)
    other = build_into_store(tpl, store, BuildSettings(max_rank=16), build=fake_build)
    assert (first.status, again.status, other.status) == ("built", "skipped", "built") and len(built) == 2
    assert store.published_key(tpl.id) == BuildSettings(max_rank=16).key(tpl)
    assert not any((tmp_path / "packs" / ".staging").iterdir())  # staging folders are removed


def test_loadtest_spreads_its_clients_over_processes(published):
    from sakura.eval.loadtest import LoadConfig, run_load

    store, _, tpl = published
    with start_server(store.url, port=0) as srv:
        summary = run_load(LoadConfig([srv.url], clients=4, edits=1, trace="fixed:200"), procs=2)
    assert summary["errors"] == 0, summary["error_samples"]
    assert summary["procs"] == summary["generator_processes"] == 2
    assert summary["edits"] == 4 and summary["templates"] == [tpl.id] and summary["shards"] == 4 * 16
    assert summary["mbytes"] > 0 and 0 < summary["time_to_shard_p50_s"] <= summary["time_to_shard_p99_s"]


def test_a_request_the_server_drops_on_a_reused_connection_is_sent_again_once():
    """The keep-alive race: a server closes an idle connection just as the client reuses it (seen under load
    as 'Server disconnected without sending a response'). The store client sends such a GET again, once."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    answered: list[str] = []

    def serve() -> None:
        for conn_no in range(2):
            conn, _ = listener.accept()
            with conn:
                for req_no in range(2):
                    head = conn.recv(65536).decode()
                    if not head:
                        break
                    if conn_no == 0 and req_no == 1:
                        break  # close without answering
                    answered.append(head.split()[1])
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    with ServerStoreClient(f"http://127.0.0.1:{port}") as client:
        assert client._get("/templates").json() == {}
        assert client._get("/packs/x/url").json() == {}  # dropped on the reused connection, answered on a new one
    listener.close()
    assert answered == ["/templates", "/packs/x/url"]
