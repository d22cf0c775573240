import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def fs_packs(tmp_path_factory):
    """Every stored format of one fs template, built once per test session (small rank: fast)."""
    from sakura.catalog import load_catalog
    from sakura.offline.builder import build_template

    out = tmp_path_factory.mktemp("packs")
    template = load_catalog().get("fs-astronaut")
    build_template(template, out, max_rank=32)
    return out, template
