"""The S3 plug-in of :mod:`sakura.net.stores`: packs as immutable objects in a bucket (AWS S3, MinIO, SeaweedFS).

Client: boto3 — the reference S3 SDK, maintained by AWS, with the presigned URLs the template server hands
out, the standard AWS environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) and thread-safe
clients; its S3 API is what every S3-compatible store is tested against. Pack bytes on the device side do
not go through boto3 at all: the device reads presigned URLs with one plain HTTP Range request per range
(:mod:`sakura.net.store_reader`), so a phone needs no credentials and no SDK.

Layout under ``s3://bucket/prefix``::

    objects/<name>.<sha256[:24]>.<ext>   every built file, content-addressed: written once, never changed
    templates/<template id>.json          the template's index: build key, and per file id its object key
                                          and size. Written last, in one PUT: publishing is atomic.

A rebuild writes new objects and then replaces the index; a reader that already resolved a file keeps
reading the same immutable bytes. A build that dies before its index PUT leaves only unreferenced
objects, which no reader can reach.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from sakura.formats import FORMATS, file_id
from sakura.net.client import FetchError
from sakura.net.store_base import Store, StoreError, check_template_id, staged_files, template_of
from sakura.net.store_reader import PresignedRangeSource

INDEX_TTL_S = 5.0  # how long a resolved index is trusted before re-reading (a server sees republishes)
PRESIGN_S = 900  # presigned URLs live 15 minutes: an edit takes seconds


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _object_name(path: Path, digest: str) -> str:
    stem, dot, ext = path.name.rpartition(".")
    return f"{stem}.{digest[:24]}.{ext}" if dot else f"{path.name}.{digest[:24]}"


def s3_client(endpoint_url: str | None = None):
    """A boto3 S3 client with bounded timeouts (a dead endpoint fails in seconds, never hangs)."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"},
                    s3={"addressing_style": "path"}, max_pool_connections=32)
    return session.client("s3", endpoint_url=endpoint_url, region_name=session.region_name or "us-east-1",
                          config=config)


def _store_error(e: Exception, what: str) -> Exception:
    """The clear error for a boto3 failure (credentials, bucket, endpoint), or ``e`` itself."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(e, NoCredentialsError):
        return StoreError(f"{what}: no credentials for the object store; set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (or a profile)")
    if isinstance(e, EndpointConnectionError):
        return StoreError(f"{what}: cannot reach the object store ({e}); check AWS_ENDPOINT_URL")
    if isinstance(e, ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500))
        if code in ("NoSuchKey", "404", "NotFound"):
            return FetchError(404, f"{what}: no such object")
        if code == "NoSuchBucket":
            return StoreError(f"{what}: the bucket does not exist")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
            return StoreError(f"{what}: the object store refused these credentials ({code})")
        return FetchError(status, f"{what}: {code or e}")
    return e


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, create: bool = False,
                 client=None) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = client or s3_client(endpoint_url)
        self._indexes: dict[str, tuple[float, dict | None]] = {}
        self._lock = threading.Lock()
        self._check_bucket(create)

    @classmethod
    def from_url(cls, url: str, **kw) -> "S3Store":
        u = urlsplit(url)
        if u.scheme != "s3" or not u.netloc or u.query or u.fragment:
            raise StoreError(f"bad store URL {url!r}: expected s3://bucket[/prefix]")
        return cls(u.netloc, u.path, **kw)

    def _check_bucket(self, create: bool) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) not in ("404", "NoSuchBucket", "NotFound"):
                raise _store_error(e, f"bucket {self.bucket!r}") from None
            if not create:
                raise StoreError(f"unknown bucket {self.bucket!r} at {self.client.meta.endpoint_url}") from None
            self.client.create_bucket(Bucket=self.bucket)
        except Exception as e:  # noqa: BLE001 - credentials / endpoint: say which
            raise _store_error(e, f"bucket {self.bucket!r}") from None

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    # -------------------------------------------------------------------------------- reading
    def index(self, template_id: str, *, fresh: bool = False) -> dict | None:
        """The template's published index (None when it has none), re-read after :data:`INDEX_TTL_S`."""
        check_template_id(template_id)
        now = time.monotonic()
        with self._lock:
            cached = self._indexes.get(template_id)
        if cached and not fresh and now - cached[0] < INDEX_TTL_S:
            return cached[1]
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key("templates", f"{template_id}.json"))
            index = json.loads(body["Body"].read())
        except Exception as e:  # noqa: BLE001
            err = _store_error(e, f"index of {template_id}")
            if not (isinstance(err, FetchError) and err.status == 404):
                raise err from None
            index = None
        with self._lock:
            self._indexes[template_id] = (now, index)
        return index

    def locate(self, fid: str) -> dict:
        """``{"key", "size", "sha256"}`` of a published file id; FetchError 404 when there is none."""
        try:
            index = self.index(template_of(fid))
        except StoreError as e:
            if "invalid template id" in str(e):
                raise FetchError(400, f"bad file id {fid!r}") from None
            raise
        entry = (index or {}).get("files", {}).get(fid)
        if entry is None:
            raise FetchError(404, f"no stored file {fid!r} in {self.url}")
        return entry

    def read(self, fid: str, offset: int, length: int) -> bytes:
        entry = self.locate(fid)
        if offset < 0 or length < 1 or offset + length > entry["size"]:
            raise FetchError(416, f"{fid}: range {offset}+{length} is outside the file ({entry['size']} bytes)")
        try:
            r = self.client.get_object(
                Bucket=self.bucket, Key=entry["key"], Range=f"bytes={offset}-{offset + length - 1}"
            )
            return r["Body"].read()
        except Exception as e:  # noqa: BLE001
            raise _store_error(e, f"{fid} in {self.url}") from None

    def size(self, fid: str) -> int:
        return int(self.locate(fid)["size"])

    def has_template(self, template_id: str) -> bool:
        files = (self.index(template_id) or {}).get("files", {})
        return all(file_id(template_id, n) in files for n in FORMATS)

    def version(self, fid: str) -> str:
        return self.locate(fid)["sha256"]

    def presign(self, fid: str, expires_s: int = PRESIGN_S) -> dict:
        """A short-lived GET URL for a published file, for a device without credentials."""
        entry = self.locate(fid)
        url = self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": entry["key"]},
                                                 ExpiresIn=int(expires_s))
        return {"url": url, "size": entry["size"], "sha256": entry["sha256"], "expires_s": int(expires_s)}

    def templates(self) -> dict[str, dict]:
        out = {}
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("templates") + "/"):
                for obj in page.get("Contents", []):
                    tid = obj["Key"].rsplit("/", 1)[1].removesuffix(".json")
                    index = self.index(tid)
                    if index:
                        out[tid] = {"build_key": index.get("build_key"),
                                    "files": {f: e["size"] for f, e in index["files"].items()}}
        except Exception as e:  # noqa: BLE001
            raise _store_error(e, f"listing {self.url}") from None
        return out

    def published_key(self, template_id: str) -> str | None:
        index = self.index(template_id, fresh=True)
        return index.get("build_key") if index else None

    def source(self):
        return PresignedRangeSource(self.presign)

    # -------------------------------------------------------------------------------- writing
    def publish(self, template_id: str, staged: Path, key: str) -> None:
        """Upload every staged file as a content-addressed object, then PUT the index (the one visible step)."""
        check_template_id(template_id)
        files: dict[str, dict] = {}
        extras: dict[str, str] = {}
        for path in staged_files(template_id, staged):
            digest = _sha256(path)
            obj = self._key("objects", _object_name(path, digest))
            self._put_once(obj, path)
            if path.suffix == ".pack":
                files[path.stem] = {"key": obj, "size": path.stat().st_size, "sha256": digest}
            else:
                extras[path.name] = obj
        index = {"template_id": template_id, "build_key": key, "files": files, "extras": extras,
                 "published_at": time.time()}
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key("templates", f"{template_id}.json"),
                                   Body=json.dumps(index, indent=1).encode(), ContentType="application/json")
        except Exception as e:  # noqa: BLE001
            raise _store_error(e, f"publishing {template_id}") from None
        with self._lock:
            self._indexes[template_id] = (time.monotonic(), index)

    def _put_once(self, key: str, path: Path) -> None:
        """Upload unless the object is there already (same name = same bytes: content-addressed). A re-used
        object is copied onto itself, which makes it young again: garbage collection keeps it through its grace
        period, long enough for this build to publish the index that references it (:mod:`sakura.net.store_gc`)."""
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            self.client.copy_object(Bucket=self.bucket, Key=key, CopySource={"Bucket": self.bucket, "Key": key},
                                    MetadataDirective="REPLACE", Metadata={"sakura-reused": "1"})
            return
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) not in ("404", "NoSuchKey", "NotFound"):
                raise _store_error(e, key) from None
        try:
            with open(path, "rb") as f:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=f)
        except Exception as e:  # noqa: BLE001
            raise _store_error(e, f"uploading {path.name}") from None
