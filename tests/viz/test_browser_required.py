"""A missing browser fails the browser tests under CI / PTESTORE_REQUIRE_BROWSER=1 and
skips them elsewhere (as PTESTORE_REQUIRE_REFLINK does for the XFS tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import browser as harness


def test_missing_browser_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "REQUIRE_BROWSER", True)
    monkeypatch.setattr(harness, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception) as exc:
        next(harness.browser_session())
    assert "browser tests required (CI / PTESTORE_REQUIRE_BROWSER=1)" in str(exc.value)
    assert "/nonexistent/chromium" in str(exc.value)


def test_missing_browser_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "REQUIRE_BROWSER", False)
    monkeypatch.setattr(harness, "CHROMEDRIVER", "/nonexistent/chromedriver")
    with pytest.raises(pytest.skip.Exception, match="/nonexistent/chromedriver"):
        next(harness.browser_session())


def test_the_request_check_sees_a_request(browser: harness.Browser, tmp_path: Path) -> None:
    """The harness itself: a page that fetches something is caught (an image from a
    closed port on 127.0.0.1: nothing leaves the machine)."""
    page = tmp_path / "fetches.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
        "<script>document.body.dataset.ready = '1'</script></body></html>"
    )
    browser.open(page)
    assert "http://127.0.0.1:9/x.png" in browser.requests(page)
