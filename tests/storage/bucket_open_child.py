"""The child process of ``test_bucket_store_race``: ``contextful table load`` with a hold before ``store.json``'s PUT.

    python -m tests.storage.bucket_open_child PROJECT TABLE FILE

Runs ``contextful --project PROJECT table load TABLE FILE`` in this process, as the command does
(its output, its errors and its exit status). The one addition observes the store's first write
of ``store.json`` to the bucket: just before the PUT leaves the process, the child prints
``HOLD store.json`` on stderr and waits for a line on stdin. A writer there has found the bucket
without a ``store.json`` (it is about to create one), so the parent can let writers that all found
it absent go in the order it chooses. The hook calls through unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

HOLD = "HOLD store.json"


def hold_before_the_store_json_put() -> None:
    from fsspec.asyn import sync_wrapper
    from s3fs import S3FileSystem

    original = S3FileSystem._call_s3
    held = False

    async def observed(self: S3FileSystem, method: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal held
        if method == "put_object" and str(kwargs.get("Key", "")).endswith("/store.json") and not held:
            held = True
            print(HOLD, file=sys.stderr, flush=True)
            sys.stdin.readline()  # the parent's go; blocking s3fs's loop thread is this child's own business
        return await original(self, method, *args, **kwargs)

    # Every request goes through ``_call_s3``; a file's upload through the sync twin, which s3fs binds
    # to the original coroutine function when the class is made.
    S3FileSystem._call_s3 = observed  # type: ignore[method-assign]
    S3FileSystem.call_s3 = sync_wrapper(observed)


def main() -> None:
    project, table, path = sys.argv[1:4]
    hold_before_the_store_json_put()
    from contextful.engine.cli import main as contextful

    sys.argv = ["contextful", "--project", project, "table", "load", table, path]
    contextful()


if __name__ == "__main__":
    main()
