"""The ``[residency]`` block: the regions this site's data plane may reside in (docs/control.md "Residency").

Implements ``surface.reside.region-entries``: the allow-set holds at most :data:`MAX_REGIONS`
entries. A region is a provider's region name as its API reports it (``eu-west-1``, ``us-east-1``):
lowercase letters, digits and hyphens. Without the block nothing is restricted. What the allow-set
gates (``surface.reside.region-mismatch``, ``site-regions``) is ``engine.control.residency``'s.

    [residency]
    regions = ["eu-west-1", "eu-central-1"]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from contextful.storage.errors import ContextfulError, ManifestKeyUnknown, ManifestValueInvalid

RESIDENCY_KEYS = ("regions",)
MAX_REGIONS = 16
"""``surface.reside.region-entries``: the most entries an allow-set holds."""

_REGION = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_MAX_REGION_CHARS = 64


@dataclass(frozen=True)
class ResidencySpec:
    """The site's residency allow-set; ``regions`` None when the manifest declares no ``[residency]``."""

    regions: tuple[str, ...] | None = None


def parse_residency(block: Any) -> tuple[ResidencySpec, list[ContextfulError]]:
    """The ``[residency]`` block and every problem in it (absent: an empty dict, no restriction)."""
    if not isinstance(block, dict):
        return ResidencySpec(), [ManifestValueInvalid("the manifest", "residency", "must be a [residency] table")]
    if not block:
        return ResidencySpec(), []
    problems: list[ContextfulError] = [ManifestKeyUnknown("[residency]", key, RESIDENCY_KEYS)
                                       for key in block if key not in RESIDENCY_KEYS]
    regions = block.get("regions")
    if not isinstance(regions, list) or not regions:
        problems.append(ManifestValueInvalid("[residency]", "regions", "must be a non-empty list of region names "
                                             f"(at most {MAX_REGIONS}), not {regions!r}"))
        return ResidencySpec(), problems
    if len(regions) > MAX_REGIONS:
        problems.append(ManifestValueInvalid("[residency]", "regions", f"holds {len(regions)} entries; a residency "
                                             f"allow-set holds at most {MAX_REGIONS}"))
    bad = [r for r in regions if not isinstance(r, str) or len(r) > _MAX_REGION_CHARS or not _REGION.fullmatch(r)]
    if bad:
        problems.append(ManifestValueInvalid("[residency]", "regions", f"{bad[0]!r} is not a region name (lowercase "
                                             "letters, digits and hyphens, as the provider spells it)"))
    repeated = sorted({r for r in regions if isinstance(r, str) and regions.count(r) > 1})
    if repeated:
        problems.append(ManifestValueInvalid("[residency]", "regions", f"names {repeated[0]!r} twice"))
    if problems:
        return ResidencySpec(), problems
    return ResidencySpec(tuple(regions)), []
