"""Headless Chromium (the Debian packages ``chromium`` and ``chromium-driver``) driven by
selenium, for the tests of the HTML pages.

The browser is the system one (``/usr/bin/chromium`` through ``/usr/bin/chromedriver``):
selenium-manager is never asked to download anything (``SE_OFFLINE``). Where either is
missing the fixture fails when ``CI`` is true or ``PTESTORE_REQUIRE_BROWSER=1`` (as
``scripts/test.sh`` sets it as root) and skips otherwise.

:class:`Browser` opens pages from ``file://`` and records what a test checks: console
messages (level SEVERE is an error) and every network request the page made (Chrome's
performance log, i.e. CDP ``Network.*`` events).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("PTESTORE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PTESTORE_CHROMEDRIVER", "/usr/bin/chromedriver")
REQUIRE_BROWSER = os.environ.get("PTESTORE_REQUIRE_BROWSER", "") not in ("", "0") or (
    os.environ.get("CI", "").lower() in ("1", "true", "yes")
)
#: The flags the tests run Chromium with: headless, nothing fetched in the background.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)


def _networked(url: str) -> bool:
    return url.split(":", 1)[0].lower() in ("http", "https", "ws", "wss", "ftp")


def _unavailable(why: str) -> None:
    if REQUIRE_BROWSER:
        pytest.fail(f"browser tests required (CI / PTESTORE_REQUIRE_BROWSER=1) but {why}")
    pytest.skip(why)


class Browser:
    """One headless Chromium session."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def open(self, path: str | os.PathLike[str]) -> float:
        """Load the local file ``path`` from ``file://``; wait for its script to mark
        ``<body data-ready>``; returns the seconds from navigation to ready."""
        self.driver.get_log("browser")
        self.driver.get_log("performance")
        url = Path(path).resolve().as_uri()
        start = time.perf_counter()
        self.driver.get(url)
        deadline = start + 60
        while (
            self.driver.execute_script("return document.body && document.body.dataset.ready") != "1"
        ):
            if time.perf_counter() > deadline:
                raise AssertionError(f"{url}: the page never became ready")
            time.sleep(0.01)
        return time.perf_counter() - start

    def console_errors(self) -> list[dict[str, Any]]:
        return [e for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]

    def requests(self, page: str | os.PathLike[str]) -> list[str]:
        """URLs of every request made since :meth:`open` by the page at ``page`` (CDP
        ``Network.requestWillBeSent`` whose document is that page, web sockets too),
        plus any request anywhere in the browser that would reach a network
        (http, https, ws, wss, ftp)."""
        url = Path(page).resolve().as_uri()
        urls = []
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            params = msg.get("params", {})
            if msg.get("method") == "Network.requestWillBeSent":
                target = params["request"]["url"]
                if params.get("documentURL") == url or _networked(target):
                    urls.append(target)
            elif msg.get("method") == "Network.webSocketCreated":
                urls.append(params["url"])
        return urls

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def screenshot(self, path: str | os.PathLike[str]) -> bytes:
        png: bytes = self.driver.get_screenshot_as_png()
        Path(path).write_bytes(png)
        return png


def browser_session() -> Iterator[Browser]:
    """A :class:`Browser` (the body of the session fixture)."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        _unavailable(
            f"{CHROMIUM} or {CHROMEDRIVER} is missing (apt-get install chromium chromium-driver)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:  # part of the [test] extra: an error in CI
        _unavailable(f"selenium is not installed ({exc})")
        raise
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must never download a driver
    profile = tempfile.mkdtemp(prefix="ptestore-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get("about:blank")  # off the new-tab page and its chrome:// resources
        yield Browser(driver)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


_COUNT_COLOURS = """
const [b64, done] = arguments;
const img = new Image();
img.onload = () => {
  const c = document.createElement("canvas");
  c.width = img.width; c.height = img.height;
  const g = c.getContext("2d");
  g.drawImage(img, 0, 0);
  const px = g.getImageData(0, 0, c.width, c.height).data;
  const seen = new Set();
  for (let i = 0; i < px.length; i += 4) {
    seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
  }
  done([img.width, img.height, seen.size]);
};
img.onerror = () => done(null);
img.src = "data:image/png;base64," + b64;
"""


def distinct_colours(browser: Browser, png: bytes) -> tuple[int, int, int]:
    """``(width, height, distinct RGB colours)`` of a screenshot, decoded by the browser
    itself on a blank page (a blank screenshot has 1 colour). Leaves the browser on
    ``about:blank``."""
    import base64

    browser.driver.get("about:blank")
    result = browser.driver.execute_async_script(_COUNT_COLOURS, base64.b64encode(png).decode())
    assert result is not None, "the browser could not decode the screenshot"
    return int(result[0]), int(result[1]), int(result[2])
