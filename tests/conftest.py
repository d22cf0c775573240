import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests start servers and agents in other processes on a 2-core machine: one torch thread per
# process avoids oversubscription, which made small matmuls 5x slower and the suite erratic.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# `sakura bench` keeps its calibration in the user's cache by default; tests never touch it.
os.environ.setdefault("SAKURA_CACHE_DIR", __import__("tempfile").mkdtemp(prefix="sakura-test-cache-"))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: 500 cases each in CI, 10 000 with HYPOTHESIS_PROFILE=long (`make fuzz`).
settings.register_profile("ci", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def fs_packs(tmp_path_factory):
    """Every stored format of one fs template, built once per test session (small rank: fast)."""
    from sakura.catalog import load_catalog
    from sakura.offline.builder import build_template

    out = tmp_path_factory.mktemp("packs")
    template = load_catalog().get("fs-astronaut")
    build_template(template, out, max_rank=32, price_requests=1)  # (prices on one request: a third of the time)
    return out, template


@pytest.fixture(scope="session")
def fs_workload_packs(fs_packs):
    """``fs_packs`` with the fs workload's other templates built beside it, as small and priced on one request: what
    a bench of the fs workload prepares (its own build of a missing template prices on three, ≈ 2× the time)."""
    from sakura.catalog import load_catalog
    from sakura.eval.bench import workload_templates
    from sakura.formats import file_id
    from sakura.offline.builder import build_template

    packs, template = fs_packs
    for tpl in workload_templates(load_catalog(), "fs"):
        if not (packs / f"{file_id(tpl.id, 'sakura')}.pack").is_file():
            build_template(tpl, packs, max_rank=32, price_requests=1)
    return packs, template


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 object store for the session (SeaweedFS on loopback unless SAKURA_TEST_STORE names one)."""
    from s3_fixture import object_store

    with object_store() as store:
        yield store
