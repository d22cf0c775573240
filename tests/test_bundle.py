"""A phone bundle (issue #33 item 4): ``sakura export --bundle`` writes every program of an edit and a manifest;
the chained programs, run with the ExecuTorch runtime from the manifest alone, give the eager step and image.

One bundle of fs-astronaut, exported once for the module, on the embedded sakura-tiny model cut to two of its
eight blocks (its first double and first single block, its weights, codec and text encoder): XNNPACK lowering
costs ~10-25 s per block on this CPU, so the whole model's bundle (`docs/results/issue33/bundle.md`) would take
minutes. At shard size 1 the bundle still has two shard programs (a double block, then the stream switch into a
single block) and every other program kind.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from sakura.catalog import load_catalog
from sakura.editing import edit_request
from sakura.model import load_model
from sakura.model.pixels import mask_bbox, resize_bilinear

pytest.importorskip("executorch")

TEMPLATE = "fs-astronaut"
SHARD_SIZE = 1
TOL = 1e-3  # max abs difference, programs vs eager (token states in [-1, 1]-ish, pixels in [0, 1])


class Headers:
    """A pack source with only headers (the bundle copies them; nothing else is read)."""

    def header_bytes(self, file_id: str) -> bytes:
        body = json.dumps({"file_id": file_id}).encode()
        return len(body).to_bytes(8, "little") + body


def random_kv(model, n: int) -> dict:
    g = torch.Generator().manual_seed(0)
    d = model.heads * model.head_dim
    return {(s, layer): (torch.randn(n, d, generator=g), torch.randn(n, d, generator=g))
            for s in range(model.num_steps) for layer in range(model.num_layers)}


def two_block_tiny():
    """sakura-tiny with its first double and first single block only (same weights, codec, text encoder)."""
    model = load_model("sakura-tiny")
    t = model.transformer
    t.transformer_blocks = torch.nn.ModuleList(list(t.transformer_blocks)[:1])
    t.single_transformer_blocks = torch.nn.ModuleList(list(t.single_transformer_blocks)[:1])
    model.model_id = "sakura-tiny-2blocks"
    assert model.num_layers == 2
    return model


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from sakura.runtime.bundle import read_headers, write_bundle

    model = two_block_tiny()
    tpl = load_catalog().get(TEMPLATE)
    req = edit_request(tpl, tpl.eval_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    out = tmp_path_factory.mktemp("bundle") / "fs"
    seen: list[tuple[str, int, int]] = []
    manifest = write_bundle(model, tpl, req, out, shard_size=SHARD_SIZE, headers=read_headers(Headers(), TEMPLATE),
                            programs_dir=tmp_path_factory.mktemp("programs"),
                            progress=lambda what, done, total: seen.append((what, done, total)))
    return model, req, out, manifest, seen


def test_manifest_lists_every_file_with_its_hash(bundle):
    from sakura.runtime.bundle_manifest import MANIFEST, load_manifest, verify_files

    model, _, out, manifest, seen = bundle
    assert load_manifest(out) == manifest
    assert verify_files(out) == []
    for f in manifest.files:  # the manifest's hashes are the files' own
        assert hashlib.sha256((out / f.path).read_bytes()).hexdigest() == f.sha256
        assert (out / f.path).stat().st_size == f.bytes
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted([f.path for f in manifest.files] + [MANIFEST])
    programs = {f.path.removeprefix("programs/") for f in manifest.files if f.role == "program"}
    assert programs == {"text_encoder.pte", "text_conditioning.pte", "reference.pte", "step_pre.pte",
                        "shard_L0_1.pte", "shard_L1_2.pte", "step_post.pte", "finish.pte"}
    assert {f.path for f in manifest.files if f.role == "header"} == {"header/fs-astronaut.header",
                                                                      "header/fs-astronaut.fp16.header"}
    assert manifest.executorch and manifest.weights["transformer"] and manifest.total_bytes == sum(
        f.bytes for f in manifest.files)
    shard = manifest.file("programs/shard_L1_2.pte")
    n, d = manifest.geometry["reusable_rows"], model.heads * model.head_dim
    assert [s.name for s in shard.inputs][-2:] == ["k1", "v1"] and shard.inputs[-1].shape == (n, d)
    assert manifest.chain[-3].inputs[:2] == ("img", "txt") and manifest.chain[-4].inputs[:2] == ("img", "txt0")
    assert all(f.max_abs_vs_eager is not None and f.max_abs_vs_eager <= TOL for f in manifest.files
               if f.role == "program")
    assert seen[-1][1] == seen[-1][2] and any("shard" in what for what, _, _ in seen)  # progress reached the end


def test_a_tampered_file_is_caught(bundle, tmp_path):
    import shutil

    from sakura.runtime.bundle_manifest import verify_files

    _, _, out, _, _ = bundle
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "template" / "sigmas.bin", "r+b") as f:
        f.write(b"\x01")
    (copy / "extra.txt").write_text("x")
    problems = verify_files(copy)
    assert any("sigmas.bin: sha256" in p for p in problems) and any("extra.txt" in p for p in problems)


def test_chained_programs_reproduce_the_eager_step_and_image(bundle):
    from sakura.runtime.bundle import BundleRunner
    from sakura.runtime.executors import get_executor

    model, req, out, manifest, _ = bundle
    kv = random_kv(model, manifest.geometry["reusable_rows"])
    # eager torch: the shard executor the device runs today (stock attention, no programs)
    run = get_executor("eager", model).prepare(req, SHARD_SIZE)
    run.begin_step(0)
    for l0, l1 in run.layer_ranges:
        run.run_shard(0, l0, l1, {(0, layer): kv[(0, layer)] for layer in range(l0, l1)})
    run.end_step(0)
    eager_step0 = run.x[run.rows].clone()

    runner = BundleRunner(out)
    y0, x0, y1, x1 = mask_bbox(req.mask)
    values = runner.begin(req.prompt, reference_bbox=resize_bilinear(req.reference, y1 - y0, x1 - x0))
    runner.step(values, 0, kv)
    err = float((values["x_rows"] - eager_step0).abs().max())
    assert err <= TOL, f"one step of the chained programs differs from eager by {err}"
    assert runner.calls == ["programs/text_encoder.pte", "programs/text_conditioning.pte", "programs/reference.pte",
                            "programs/step_pre.pte", "programs/shard_L0_1.pte", "programs/shard_L1_2.pte",
                            "programs/step_post.pte"]

    for step in range(1, model.num_steps):  # and the whole edit
        runner.step(values, step, kv)
        run.begin_step(step)
        for l0, l1 in run.layer_ranges:
            run.run_shard(step, l0, l1, {(step, layer): kv[(step, layer)] for layer in range(l0, l1)})
        run.end_step(step)
    image = runner.finish(values)
    err = float(np.abs(image - run.result()).max())
    assert err <= TOL, f"the bundle's image differs from eager by {err}"


def test_bad_bundle_folders_are_one_line(tmp_path):
    """Unknown template, a non-empty folder without --force, an unwritable folder, QNN, no packs: one line, exit 2,
    no traceback, nothing written (the command as `sakura` registers it, run in this process)."""
    import typer
    from typer.testing import CliRunner

    from sakura.cli.errors import friendly
    from sakura.cli.export import export_cmd

    cli = typer.Typer()
    cli.command("export")(friendly(export_cmd))
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    unwritable = Path("/sys/sakura-bundle") if os.geteuid() == 0 else locked / "b"  # (root writes anywhere else)
    cases = {("-t", "no-such-template", "--bundle", str(tmp_path / "b")): "no-such-template",
             ("-t", TEMPLATE, "--bundle", str(full)): "not empty",
             ("-t", TEMPLATE, "--bundle", str(unwritable)): "cannot write the bundle",
             ("-t", TEMPLATE, "--bundle", str(tmp_path / "b"), "--backend", "qnn"): "XNNPACK programs",
             ("-t", TEMPLATE, "--bundle", str(tmp_path / "b"), "--packs", str(full)): "no packs for fs-astronaut"}
    try:
        for args, words in cases.items():
            r = CliRunner().invoke(cli, list(args))
            lines = [x for x in r.stderr.splitlines() if x.strip()]
            assert r.exit_code == 2, (r.stderr, r.exception)
            assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.stderr
            assert not (tmp_path / "b").exists()
    finally:
        locked.chmod(0o700)
    assert [p.name for p in full.iterdir()] == ["x"]  # untouched
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind
