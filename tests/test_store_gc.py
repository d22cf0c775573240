"""`sakura store gc` against a real S3 store (SeaweedFS): unreferenced content-addressed objects go, what a
published index references never does, and young objects (an in-flight build's writes) are kept."""

from __future__ import annotations

import time

import pytest

from sakura.formats import FORMATS, file_id
from sakura.net.store_gc import collect
from sakura.net.stores import StoreError, open_store

TPL = "fs-astronaut"


def stage(tmp_path, name: str, main_pack: bytes):
    """A staged build of TPL with small stand-in files; ``main_pack`` is the SAKURA pack's bytes."""
    staged = tmp_path / name
    staged.mkdir()
    for fmt in FORMATS:
        data = main_pack if fmt == "sakura" else f"{fmt} bytes".encode()
        (staged / f"{file_id(TPL, fmt)}.pack").write_bytes(data)
    (staged / f"{TPL}.build.json").write_text('{"build": "' + name + '"}')
    return staged


def object_keys(store) -> set[str]:
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store._key("objects") + "/")
    return {o["Key"] for o in listed.get("Contents", [])}


def test_gc_deletes_only_old_unreferenced_objects(s3, tmp_path, capsys):
    store = open_store(s3.url("gc"), create=True)
    store.publish(TPL, stage(tmp_path, "first", b"first build"), "k1")
    replaced = {store.locate(TPL)["key"], *store.index(TPL)["extras"].values()}
    store.publish(TPL, stage(tmp_path, "second", b"second build"), "k2")  # a rebuild: old main pack + record orphaned
    orphan = store._key("objects", "fs-grace-hopper.0123456789abcdef01234567.pack")  # a build that died unpublished
    store.client.put_object(Bucket=store.bucket, Key=orphan, Body=b"half a pack")
    referenced = {e["key"] for e in store.index(TPL)["files"].values()} | set(store.index(TPL)["extras"].values())
    everything = object_keys(store)
    unreferenced = replaced | {orphan}
    assert len(replaced) == 2 and not replaced & referenced and unreferenced <= everything

    young = collect(store, grace_s=3600)  # the default grace: everything here was written seconds ago
    assert (young.garbage, sorted(young.young), young.referenced) == ([], sorted(unreferenced), len(referenced))
    dry = collect(store, grace_s=0)
    assert sorted(dry.garbage) == sorted(unreferenced) and not dry.deleted
    assert object_keys(store) == everything  # a dry run deletes nothing

    from sakura.cli.store import gc_cmd

    gc_cmd(store.url, grace=0, yes=True, as_json=False)
    out = capsys.readouterr().out
    assert f"deleted {orphan}" in out and "deleted 3 objects" in out
    assert object_keys(store) == referenced
    for fmt in FORMATS:  # every published file still reads
        fid = file_id(TPL, fmt)
        assert store.read(fid, 0, store.size(fid))
    assert collect(store, grace_s=0).garbage == []


def test_a_reused_object_is_refreshed_and_a_bad_index_stops_gc(s3, tmp_path):
    store = open_store(s3.url("gc-reuse"), create=True)
    store.publish(TPL, stage(tmp_path, "a", b"same bytes"), "k1")
    key = store.locate(TPL)["key"]
    before = store.client.head_object(Bucket=store.bucket, Key=key)["LastModified"]
    time.sleep(1.1)
    store.publish(TPL, stage(tmp_path, "b", b"same bytes"), "k2")  # same content: the object is re-used...
    assert store.locate(TPL)["key"] == key
    assert store.client.head_object(Bucket=store.bucket, Key=key)["LastModified"] > before  # ...and made young

    orphan = store._key("objects", "x.0123456789abcdef01234567.pack")
    store.client.put_object(Bucket=store.bucket, Key=orphan, Body=b"x")
    store.client.put_object(Bucket=store.bucket, Key=store._key("templates", "broken.json"), Body=b"not json")
    with pytest.raises(StoreError, match="broken.json is unreadable.*nothing was deleted"):
        collect(store, grace_s=0, delete=True)
    assert orphan in object_keys(store)


def test_gc_of_a_folder_or_a_bad_grace_says_why(tmp_path, s3):
    with pytest.raises(StoreError, match="is a folder"):
        collect(open_store(tmp_path, create=True))
    with pytest.raises(StoreError, match="grace period"):
        collect(open_store(s3.url("gc-bad"), create=True), grace_s=-1)
