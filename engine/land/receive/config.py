"""The ``receive`` source's config (``[pipeline.source.config]``), checked all at once.

Config::

    key_retention_secs = 86400   # required: how long a batch key replays or resumes
    max_queue_depth = 64         # optional: most members one group lands (default 64)
    format = "ndjson"            # optional: ndjson (default) | json (one JSON array of records)
    max_body_bytes = 268435456   # optional: most bytes of one request body as sent (default 256 MiB)
    max_decoded_bytes = 268435456  # optional: most bytes a gzip/zstd body decodes to (default 256 MiB)

``key_retention_secs`` has no default (decision "batch-key-answers"): a key answering forever
promises deduplication the store cannot bound, and no default chooses a window for the sender.

Example::

    >>> ReceiveConfig.from_config({"key_retention_secs": 60}).max_queue_depth
    64
    >>> [p.name for p in check_config("source.config", {"format": "csv"})]
    ['ManifestValueInvalid', 'ManifestValueInvalid']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contextful.storage.errors import (
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)

CONFIG_KEYS = ("key_retention_secs", "max_queue_depth", "format", "max_body_bytes", "max_decoded_bytes")
FORMATS = ("ndjson", "json")
DEFAULT_MAX_QUEUE_DEPTH = 64
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""The default bound of a request body, as sent and once decoded."""
MAX_GROUP_BYTES = 64 * 1024 * 1024
"""A group lands at most this many spooled Arrow bytes (always at least one member)."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_config(where: str, config: dict[str, Any]) -> list[ContextfulError]:
    """Every problem of a ``receive`` source's config (empty when it is valid)."""
    problems: list[ContextfulError] = [ManifestKeyUnknown(where, k, CONFIG_KEYS) for k in config if k not in CONFIG_KEYS]
    retention = config.get("key_retention_secs")
    if retention is None:
        problems.append(ManifestValueInvalid(
            where, "key_retention_secs", "is required: how many seconds a batch key replays or resumes after its "
                                         "first attempt (no default chooses a window for the sender)"))
    elif not _number(retention) or retention <= 0:
        problems.append(ManifestValueInvalid(where, "key_retention_secs",
                                             f"must be a positive number of seconds, not {retention!r}"))
    for key, default in (("max_queue_depth", DEFAULT_MAX_QUEUE_DEPTH), ("max_body_bytes", DEFAULT_MAX_BODY_BYTES),
                         ("max_decoded_bytes", DEFAULT_MAX_BODY_BYTES)):
        value = config.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(ManifestValueInvalid(where, key, f"must be a positive integer, not {value!r}"))
    fmt = config.get("format", "ndjson")
    if fmt not in FORMATS:
        problems.append(ManifestValueInvalid(where, "format", f"{fmt!r} is not one of {', '.join(FORMATS)}"))
    return problems


@dataclass(frozen=True)
class ReceiveConfig:
    key_retention_secs: float
    """Seconds after a key's first attempt during which it replays or resumes; later it is expired."""
    max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH
    """Most spooled members one group lands as one run per touched table."""
    format: str = "ndjson"
    """How a request body reads: ``ndjson`` (one record per line) or ``json`` (an array of records)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Most bytes of one request body as sent; a longer one answers 413 and nothing of it is spooled."""
    max_decoded_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Most bytes a ``Content-Encoding: gzip``/``zstd`` body decodes to; past it the batch answers 413."""

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "[pipeline.source.config]") -> ReceiveConfig:
        """The config read; ManifestInvalid listing every problem when it is not valid."""
        problems = check_config(where, config)
        if problems:
            raise ManifestInvalid(where, problems)
        return cls(float(config["key_retention_secs"]), int(config.get("max_queue_depth", DEFAULT_MAX_QUEUE_DEPTH)),
                   str(config.get("format", "ndjson")), int(config.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)),
                   int(config.get("max_decoded_bytes", DEFAULT_MAX_BODY_BYTES)))
