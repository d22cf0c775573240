"""The template catalog: embedded manifest, masks, requests, custom manifests and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sakura.catalog import (
    TASKS,
    CatalogError,
    UnknownTemplateError,
    default_catalog_path,
    load_catalog,
    load_image_spec,
    token_mask,
)

RATIO_RANGES = {"fs": (0.08, 0.14), "vton": (0.20, 0.32), "mb": (0.14, 0.24)}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


# ------------------------------------------------------------------ embedded catalog
def test_embedded_manifest_is_the_templates_catalog_file(catalog):
    assert default_catalog_path().is_file()
    assert default_catalog_path().parent.name == "templates_catalog"
    assert catalog.path == default_catalog_path()
    assert len(catalog) == len(catalog.ids) == len(set(catalog.ids))


def test_at_least_two_templates_per_task_and_an_sd_pair(catalog):
    for task in TASKS:
        assert len(catalog.by_task(task)) >= 2, task
    sd = catalog.filter(task="mb", model="sakura-tiny-sd3")
    assert len(sd) >= 2
    assert all(t.model == "sakura-tiny" for t in catalog.by_task("fs") + catalog.by_task("vton"))


@pytest.mark.parametrize("task", TASKS)
def test_mask_ratios_near_the_papers(catalog, task):
    lo, hi = RATIO_RANGES[task]
    for t in catalog.by_task(task):
        assert lo <= t.mask_ratio <= hi, (t.id, t.mask_ratio)


def test_profile_and_eval_requests(catalog):
    for t in catalog:
        assert len(t.profile_requests) == 5, t.id
        assert len(t.eval_requests) >= 5, t.id
        prof = {r.key for r in t.profile_requests}
        ev = {r.key for r in t.eval_requests}
        assert len(prof) == 5 and len(ev) == len(t.eval_requests)
        assert not prof & ev, t.id
        for r in t.requests:
            if t.task == "mb":
                assert r.is_text and r.prompt.strip()
                with pytest.raises(CatalogError):
                    r.reference_image()
            else:
                assert r.prompt is None
                ref = r.reference_image(48)
                assert ref.shape == (48, 48, 3) and ref.dtype == np.float32
                assert 0.0 <= ref.min() and ref.max() <= 1.0 and ref.std() > 0.01


def test_images_and_masks(catalog):
    for t in catalog:
        img = t.image()
        assert img.shape == (256, 256, 3) and img.dtype == np.float32
        assert 0.0 <= img.min() and img.max() <= 1.0 and img.std() > 0.05
        m = t.mask()
        assert m.shape == (256, 256) and m.dtype == bool
        assert 0 < m.sum() < m.size
        assert t.image(128).shape == (128, 128, 3)
        small = t.mask(128)
        assert abs(small.mean() - m.mean()) < 0.02  # the same region at every resolution
        img[:] = 0  # callers get a copy: the cached pixels stay intact
        assert t.image().max() > 0


def test_token_mask_matches_pixel_mask(catalog):
    for t in catalog:
        m = t.mask(256)
        tm = t.token_mask()
        assert tm.shape == (1024,) and tm.dtype == bool
        brute = np.array([m[r * 8:(r + 1) * 8, c * 8:(c + 1) * 8].any() for r in range(32) for c in range(32)])
        np.testing.assert_array_equal(tm, brute)
        # every masked pixel lies in a masked token, so the token ratio is at least the pixel ratio
        pix_from_tokens = np.repeat(np.repeat(tm.reshape(32, 32), 8, 0), 8, 1)
        assert not (m & ~pix_from_tokens).any()
        assert t.token_ratio >= t.mask_ratio
        assert t.token_mask(grid=16).shape == (256,)
        assert 0 < t.reference_size() <= 256 and t.reference_size() % 8 == 0


def test_token_mask_function_rejects_ragged_masks():
    with pytest.raises(CatalogError):
        token_mask(np.ones((20, 20), bool), 8)


def test_unknown_template_id_is_a_keyerror_with_the_valid_ids(catalog):
    with pytest.raises(KeyError) as ei:
        catalog.get("no-such-template")
    e = ei.value
    assert isinstance(e, UnknownTemplateError) and isinstance(e, CatalogError)
    msg = str(e)
    assert "\n" not in msg and not msg.startswith("'")
    assert "no-such-template" in msg and all(i in msg for i in catalog.ids)
    assert "fs-astronaut" in catalog and "no-such-template" not in catalog
    with pytest.raises(CatalogError):
        catalog.by_task("swap")


# ------------------------------------------------------------------ image specs
def test_image_specs_gray_rgba_crop_flip_hue():
    gray = load_image_spec("skimage:camera", resolution=64)
    assert gray.shape == (64, 64, 3)
    np.testing.assert_array_equal(gray[..., 0], gray[..., 2])
    rgba = load_image_spec("skimage:logo", resolution=32)  # RGBA in the package
    assert rgba.shape == (32, 32, 3)
    face = load_image_spec("skimage:lfw_subset:17", resolution=64)  # 25x25 gray, upsampled
    assert face.shape == (64, 64, 3)
    base = load_image_spec({"ref": "skimage:coffee", "crop": [0.0, 0.0, 0.5, 0.5]}, resolution=64)
    flipped = load_image_spec({"ref": "skimage:coffee", "crop": [0.0, 0.0, 0.5, 0.5], "flip": True}, resolution=64)
    np.testing.assert_allclose(flipped, base[:, ::-1])
    hued = load_image_spec({"ref": "skimage:coffee", "crop": [0.0, 0.0, 0.5, 0.5], "hue": 0.5}, resolution=64)
    assert np.abs(hued - base).mean() > 0.05
    assert hued.dtype == np.float32 and 0 <= hued.min() and hued.max() <= 1


@pytest.mark.parametrize("spec, words", [
    ("skimage:no_such_image", ["unknown package image", "skimage:no_such_image"]),
    ("skimage:lfw_subset", ["needs an index"]),
    ("skimage:lfw_subset:200", ["needs an index"]),
    ("skimage:astronaut:3", ["takes no index"]),
    ({"ref": "skimage:coffee", "crop": [0.5, 0.0, 0.2, 1.0]}, ["crop"]),
    ({"ref": "skimage:coffee", "hue": 3}, ["hue"]),
    ({"ref": "skimage:coffee", "zoom": 2}, ["unknown key"]),
    ("missing-file.png", ["not found"]),
])
def test_bad_image_specs(tmp_path, spec, words):
    with pytest.raises(CatalogError) as ei:
        load_image_spec(spec, tmp_path)
    msg = str(ei.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


# ------------------------------------------------------------------ custom manifests
def _write_manifest(dirpath: Path, body: str, name: str = "catalog.toml") -> Path:
    p = dirpath / name
    p.write_text(textwrap.dedent(body), encoding="utf-8")
    return p


def _fs_template(tid: str = "t1", task: str = "fs", image: str = '"skimage:astronaut"',
                 mask: str = "{ellipse = [0.5, 0.3, 0.15, 0.2]}", extra: str = "") -> str:
    if task == "mb":
        reqs = ('profile = ["a", "b", "c", "d", "e"]\n'
                'eval = ["f", "g", "h", "i", "j"]')
    else:
        reqs = ("profile = " + json.dumps([f"skimage:lfw_subset:{i}" for i in range(5)]) + "\n"
                "eval = " + json.dumps([f"skimage:lfw_subset:{i}" for i in range(50, 55)]))
    return f'[[templates]]\nid = "{tid}"\ntask = "{task}"\nimage = {image}\nmask = {mask}\n{extra}\n{reqs}\n'


@pytest.fixture
def custom_manifest(tmp_path):
    """A manifest in tmp_path with a file image (RGBA PNG), a PNG mask and a file reference."""
    rng = np.random.default_rng(0)
    img = np.zeros((120, 160, 4), np.uint8)
    img[..., :3] = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    img[..., 3] = 255
    (tmp_path / "img").mkdir()
    Image.fromarray(img, "RGBA").save(tmp_path / "img" / "photo.png")
    mask = np.zeros((64, 64), np.uint8)
    mask[10:30, 20:40] = 255
    Image.fromarray(mask).save(tmp_path / "img" / "mask.png")
    Image.fromarray(rng.integers(0, 256, (40, 40), dtype=np.uint8)).save(tmp_path / "img" / "ref.jpg")
    body = f"""
    [catalog]
    name = "custom"

    [[templates]]
    id = "my-vton"
    task = "vton"
    image = "img/photo.png"
    mask = "img/mask.png"
    profile = ["img/ref.jpg", {{ref = "img/ref.jpg", flip = true}}, "skimage:coffee", "skimage:grass",
               {{ref = "sklearn:china", crop = [0.1, 0.1, 0.3, 0.3], hue = 0.2}}]
    eval = ["skimage:gravel", "skimage:brick", {{ref = "img/ref.jpg", hue = 0.5}}, "sklearn:flower",
            "skimage:colorwheel"]

    {
        _fs_template(
            "my-mb",
            "mb",
            mask="[{box = [0.1, 0.1, 0.3, 0.3]}, {polygon = [[0.6, 0.6], [0.9, 0.6], [0.75, 0.9]]}]",
            extra='model = "sakura-tiny-sd3"',
        )
    }
    """
    return _write_manifest(tmp_path, body)


def test_custom_manifest_with_files(custom_manifest):
    cat = load_catalog(custom_manifest)
    assert cat.name == "custom" and cat.ids == ["my-vton", "my-mb"]
    t = cat.get("my-vton")
    assert t.model == "sakura-tiny"
    img = t.image()
    assert img.shape == (256, 256, 3) and img.dtype == np.float32
    m = t.mask()
    assert abs(m.mean() - (20 * 20) / (64 * 64)) < 0.01
    assert m[int(20 / 64 * 256), int(30 / 64 * 256)] and not m[0, 0]
    assert t.profile_requests[0].reference_image(32).shape == (32, 32, 3)
    mb = cat.get("my-mb")
    assert mb.model == "sakura-tiny-sd3" and mb.profile_requests[0].prompt == "a"
    assert abs(mb.mask_ratio - (0.2 * 0.2 + 0.3 * 0.3 / 2)) < 0.005  # box + triangle
    cat.validate()


def test_custom_manifest_via_cli(custom_manifest):
    pytest.importorskip("sakura.cli")
    code = "import sys; from sakura.cli import main; sys.argv[0] = 'sakura'; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", code, "catalog", "list", "--catalog", str(custom_manifest), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {row["id"] for row in json.loads(r.stdout)} == {"my-vton", "my-mb"}


def test_contact_sheet(custom_manifest, tmp_path):
    from sakura.catalog.contact_sheet import main

    out = tmp_path / "sheet.png"
    assert main([str(out), "--catalog", str(custom_manifest)]) == 0
    with Image.open(out) as im:
        assert im.width > 512 and im.height > 256


def _bad(tmp_path: Path, body: str) -> str:
    with pytest.raises(CatalogError) as ei:
        load_catalog(_write_manifest(tmp_path, body))
    msg = str(ei.value)
    assert "\n" not in msg and len(msg) < 500, msg
    return msg


def test_bad_manifest_unknown_package_image(tmp_path):
    msg = _bad(tmp_path, _fs_template(image='"skimage:astronot"'))
    assert "unknown package image 'skimage:astronot'" in msg and "astronaut" in msg and "'t1'" in msg


def test_bad_manifest_wrong_shape_mask_png(tmp_path):
    Image.fromarray(np.full((40, 60), 255, np.uint8)).save(tmp_path / "m.png")
    msg = _bad(tmp_path, _fs_template(mask='"m.png"'))
    assert "m.png" in msg and "60x40" in msg and "square" in msg


def test_bad_manifest_unreadable_files(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"this is not a PNG")
    assert "cannot read" in _bad(tmp_path, _fs_template(image='"broken.png"'))
    assert "cannot read mask" in _bad(tmp_path, _fs_template(mask='"broken.png"'))
    assert "not found" in _bad(tmp_path, _fs_template(mask='"nope.png"'))


def test_bad_manifest_task_and_ids(tmp_path):
    msg = _bad(tmp_path, _fs_template(task="swap"))
    assert "invalid task 'swap'" in msg and "fs, vton, mb" in msg
    msg = _bad(tmp_path, _fs_template("dup") + _fs_template("dup"))
    assert "duplicate template id 'dup'" in msg
    assert "needs an id" in _bad(tmp_path, _fs_template("bad id"))
    assert "unknown key" in _bad(tmp_path, _fs_template(extra='colour = "red"'))
    assert "no templates" in _bad(tmp_path, '[catalog]\nname = "x"\n')
    assert "not valid TOML" in _bad(tmp_path, "[[templates]\n")


def test_bad_manifest_masks(tmp_path):
    assert "empty" in _bad(tmp_path, _fs_template(mask="{box = [0.5, 0.5, 0.501, 0.501]}"))
    assert "whole image" in _bad(tmp_path, _fs_template(mask="{box = [0.0, 0.0, 1.0, 1.0]}"))
    assert "box" in _bad(tmp_path, _fs_template(mask="{box = [0.5, 0.5, 0.2]}"))
    assert "radii" in _bad(tmp_path, _fs_template(mask="{ellipse = [0.5, 0.5, 0.0, 0.2]}"))
    assert "circle" in _bad(tmp_path, _fs_template(mask='{circle = [0.5, 0.5, 0.2]}'))


def test_bad_manifest_requests(tmp_path):
    body = _fs_template().replace("skimage:lfw_subset:54", "skimage:lfw_subset:4")
    assert "both profile and eval" in _bad(tmp_path, body)
    body = _fs_template().replace('"skimage:lfw_subset:4"', '"skimage:lfw_subset:3"')
    assert "twice" in _bad(tmp_path, body)
    body = _fs_template().replace(', "skimage:lfw_subset:4"', "")
    assert "exactly 5 profiling" in _bad(tmp_path, body)
    body = _fs_template(task="mb").replace('"j"', '" "')
    assert "non-empty instruction" in _bad(tmp_path, body)


def test_missing_manifest_file(tmp_path):
    with pytest.raises(CatalogError, match="not found"):
        load_catalog(tmp_path / "nope.toml")
