"""Garbage collection of an S3 pack store: delete the content-addressed objects no published index references.

A rebuild writes new objects and swaps the template's index (:mod:`sakura.net.s3store`), and a build that dies
before publishing leaves its objects behind; neither is ever read again. :func:`collect` finds them:

1. list ``objects/`` (key, size, last modified);
2. then read every index ``templates/<id>.json`` — after the listing, so an index published meanwhile is seen;
3. an object is garbage when no index references it *and* it is older than the grace period (default 1 h), so
   a build that has written its objects but not yet its index keeps them; a build re-using an existing
   object refreshes its age first (:meth:`S3Store._put_once`);
4. before each delete, the object's age is checked again (a build may have re-used it since the listing).

An index that cannot be read stops the collection before anything is deleted: what it references is unknown.
Dry run by default; ``delete=True`` deletes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sakura.net.s3store import S3Store, _store_error
from sakura.net.stores import StoreError

DEFAULT_GRACE_S = 3600.0


@dataclass
class GcReport:
    store: str
    grace_s: float
    deleted: bool  # False: a dry run (``garbage`` lists what would be deleted)
    referenced: int = 0  # objects some published index references
    young: list[str] = field(default_factory=list)  # unreferenced, but within the grace period: kept
    garbage: list[str] = field(default_factory=list)  # unreferenced and old: deleted (or would be)
    garbage_bytes: int = 0

    def to_dict(self) -> dict:
        return {"store": self.store, "grace_s": self.grace_s, "deleted": self.deleted, "referenced": self.referenced,
                "young": len(self.young), "garbage": len(self.garbage), "garbage_bytes": self.garbage_bytes,
                "garbage_keys": self.garbage}


def _age_s(last_modified: datetime, now: float) -> float:
    return now - last_modified.astimezone(timezone.utc).timestamp()


def referenced_keys(store) -> set[str]:
    """Every object key a published index of ``store`` names (pack files and build records)."""
    keys: set[str] = set()
    paginator = store.client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=store.bucket, Prefix=store._key("templates") + "/"):
        for obj in page.get("Contents", []):
            try:
                body = store.client.get_object(Bucket=store.bucket, Key=obj["Key"])["Body"].read()
                index = json.loads(body)
                keys |= {entry["key"] for entry in index["files"].values()}
                keys |= set(index.get("extras", {}).values())
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise StoreError(f"index {obj['Key']} is unreadable ({type(e).__name__}: {e}); nothing was "
                                 "deleted: fix or remove it first") from None
            except Exception as e:  # noqa: BLE001 - boto3: say what failed
                raise _store_error(e, f"reading {obj['Key']}") from None
    return keys


def collect(store, *, grace_s: float = DEFAULT_GRACE_S, delete: bool = False) -> GcReport:
    """Find (and with ``delete``, delete) the unreferenced objects of an S3 store older than ``grace_s``."""
    if not isinstance(store, S3Store):
        raise StoreError(f"{store.url} is a folder: it keeps only the published files, so there is nothing to "
                         "collect (gc is for s3:// stores)")
    if grace_s < 0:
        raise StoreError(f"the grace period must be >= 0 seconds, got {grace_s}")
    report = GcReport(store.url, float(grace_s), delete)
    paginator = store.client.get_paginator("list_objects_v2")
    try:
        listed = [o for page in paginator.paginate(Bucket=store.bucket, Prefix=store._key("objects") + "/")
                  for o in page.get("Contents", [])]
    except Exception as e:  # noqa: BLE001
        raise _store_error(e, f"listing {store.url}") from None
    referenced = referenced_keys(store)  # read after the listing: an index published meanwhile is seen
    now = time.time()
    for obj in listed:
        key = obj["Key"]
        if key in referenced:
            report.referenced += 1
        elif _age_s(obj["LastModified"], now) < grace_s or (delete and not _still_old(store, key, grace_s)):
            report.young.append(key)
        else:
            if delete:
                try:
                    store.client.delete_object(Bucket=store.bucket, Key=key)
                except Exception as e:  # noqa: BLE001
                    raise _store_error(e, f"deleting {key}") from None
            report.garbage.append(key)
            report.garbage_bytes += int(obj.get("Size", 0))
    return report


def _still_old(store, key: str, grace_s: float) -> bool:
    """Checked right before deleting: a build may have re-used (and so refreshed) the object since the listing."""
    from botocore.exceptions import ClientError

    try:
        head = store.client.head_object(Bucket=store.bucket, Key=key)
    except ClientError:
        return False  # gone already, or unknown: leave it
    return _age_s(head["LastModified"], time.time()) >= grace_s
