"""A missing browser fails the browser tests under CI / PTESTORE_REQUIRE_BROWSER=1 and
skips them elsewhere (as PTESTORE_REQUIRE_REFLINK does for the XFS tests)."""

from __future__ import annotations

import pytest
from support import browser


def test_missing_browser_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "REQUIRE_BROWSER", True)
    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception) as exc:
        next(browser.browser_session())
    assert "browser tests required (CI / PTESTORE_REQUIRE_BROWSER=1)" in str(exc.value)
    assert "/nonexistent/chromium" in str(exc.value)


def test_missing_browser_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "REQUIRE_BROWSER", False)
    monkeypatch.setattr(browser, "CHROMEDRIVER", "/nonexistent/chromedriver")
    with pytest.raises(pytest.skip.Exception, match="/nonexistent/chromedriver"):
        next(browser.browser_session())
