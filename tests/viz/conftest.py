"""The browser tests of the HTML pages share one headless Chromium (tests/support/browser.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.browser import Browser, browser_session


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Headless system Chromium; a failure (not a skip) when missing under CI or
    ``PTESTORE_REQUIRE_BROWSER=1``."""
    yield from browser_session()
