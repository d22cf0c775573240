"""Property test (hypothesis) of stored-file headers as a client parses them (issue #30 item 3): one field of a
real header — SAKURA pack, FP16, IntQ, CacheGen — replaced by any JSON value gives a stream encoding or a
one-line PackFormatError, never another exception. Files are written from a small synthetic cache (no model)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sakura.formats import FORMATS, PackFormatError
from sakura.formats.cachegen import write_cachegen
from sakura.formats.fp16 import write_fp16
from sakura.formats.intq import write_intq
from sakura.offline import pack_cache
from sakura.offline.ladder import add_ladder
from sakura.offline.synthetic import synthetic_cache

# sakura: the v1 layout; sakura-v2: the allocated one; sakura-v3: the allocated one with the ladder (issue #34)
FMTS = ("sakura", "sakura-v2", "sakura-v3", "fp16", "intq", "cachegen")


@pytest.fixture(scope="module")
def headers(tmp_path_factory) -> dict[str, dict]:
    cache, imp = synthetic_cache(num_steps=2, num_layers=4)
    cache = cache.to(torch.float16)
    d = tmp_path_factory.mktemp("headers")
    ids = {"model_id": "synthetic", "template_id": "t0"}
    pack_cache(d / "sakura.pack", cache, imp, q=0.5, max_rank=16, shard_size=2, **ids)
    pack_cache(d / "sakura-v2.pack", cache, imp, q=0.5, max_rank=16, shard_size=2, layout="allocated",
               shared_basis=True, **ids)
    write_fp16(d / "fp16.pack", cache, shard_size=2, **ids)
    shutil.copy(d / "sakura-v2.pack", d / "sakura-v3.pack")
    add_ladder(d / "sakura-v3.pack", d / "fp16.pack", "t0.fp16", imp)
    write_intq(d / "intq.pack", cache, shard_size=2, **ids)
    write_cachegen(d / "cachegen.pack", cache, shard_size=2, **ids)
    out = {}
    for fmt in FMTS:
        raw = (d / f"{fmt}.pack").read_bytes()
        out[fmt] = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    return out


def paths(obj, prefix=()):
    """Every path into a JSON tree (lists: their first 3 items), the root's children first."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj[:3]) if isinstance(obj, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from paths(v, prefix + (k,))


values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=8)),
                      lambda inner: st.one_of(st.lists(inner, max_size=4),
                                              st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)


def encoded(header: dict) -> bytes:
    text = json.dumps(header, allow_nan=True).encode()
    return len(text).to_bytes(8, "little") + text


@pytest.mark.parametrize("fmt", FMTS)
def test_a_header_with_one_field_replaced_parses_or_is_a_format_error(headers, fmt):
    header = headers[fmt]
    parse = FORMATS[fmt.removesuffix("-v2").removesuffix("-v3")].encoding_cls.from_header
    parse(encoded(header))  # the real one parses
    where = sorted(set(paths(header)), key=len)

    replaced_fields_parse_or_fail_in_one_line(header, parse, where)


def replaced_fields_parse_or_fail_in_one_line(header: dict, parse, where: list[tuple]) -> None:
    """Any JSON value at any of ``where`` (paths into the header; None steps skipped): the header parses or is a
    one-line PackFormatError."""

    @given(st.sampled_from(where), values)
    def check(path, value):
        changed = json.loads(json.dumps(header))
        path = tuple(k for k in path if k is not None)
        obj = changed
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
        try:
            parse(encoded(changed))
        except PackFormatError as e:
            assert "\n" not in str(e) and len(str(e)) < 400, str(e)[:500]

    check()


def test_a_ladder_field_replaced_parses_or_is_a_format_error(headers):
    """The v3 fields past the first rows the generic test walks: each shard's rung rows (the last rows of its
    frontier) and the FP16 reference of every shard, replaced by any JSON value."""
    header = headers["sakura-v3"]
    parse = FORMATS["sakura"].encoding_cls.from_header
    shards = len(header["shards"])
    where = [("tradeoff", "frontiers", s, -j, i) for s in range(shards) for j in (1, 2, 3) for i in (None, 0, 1, 2)]
    where += [("ladder", "fp16", "shards", s, i) for s in range(shards) for i in (None, 0, 1, 2)]
    where += [("ladder", "fp16", k) for k in ("file_id", "base", "file_size", "shards")] + [("ladder",)]
    replaced_fields_parse_or_fail_in_one_line(header, parse, where)
