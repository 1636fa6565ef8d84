"""An HTTP proxy on loopback in front of the S3-compatible server that drops ``If-None-Match``.

It stands for an S3-compatible server that predates conditional writes: such a server ignores the
header and accepts every PUT, so a client's create-if-absent silently overwrites. Every request is
forwarded to the upstream endpoint unchanged but for that header; answers come back unchanged.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from tests.support.recording_proxy import RecordingProxy

DROPPED = frozenset({"if-none-match"})


class IgnoringConditionsProxy(RecordingProxy):
    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, drop=DROPPED)
        self.endpoint = self.url

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
