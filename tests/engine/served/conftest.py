"""Fixtures of the console tests: one landed project per test module, served by a real serve child."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.served.console_site import Site, console_served, landed_site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The console's project (tests.engine.served.console_site.landed_site), one per test module."""
    return landed_site(tmp_path_factory.mktemp("console"))


@pytest.fixture(scope="module")
def url(site: Site) -> Iterator[str]:
    """``contextful pipeline serve --http`` over :func:`site`'s project: its URL."""
    with console_served(site) as serve:
        yield serve.url
