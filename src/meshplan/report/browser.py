"""Headless Chromium through Playwright, for the report's browser tests and the screenshots in the docs.

Playwright (the ``playwright`` package, in the ``dev`` extra) drives the Chromium installed on the machine
(``/usr/bin/chromium``, or ``$CHROMIUM``); it never downloads a browser of its own. As root Chromium needs
``--no-sandbox``; the other flags keep it off the network (no component updates, no sync, no background requests).

    with chromium() as browser:
        page = open_page(browser, Path("report.html"), width=1280)
        page.screenshot(path="shot.png", full_page=True)
        page.meshplan_errors      # console errors and warnings, uncaught exceptions and failed or outside requests
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError, MissingDependency

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic", "--no-default-browser-check", "--disable-extensions",
         "--mute-audio")


class BrowserError(MeshplanError):
    """No Chromium to drive."""


def find_chromium() -> str | None:
    """``$CHROMIUM``, else the first of chromium / chromium-browser / google-chrome on PATH, else None."""
    env = os.environ.get("CHROMIUM")
    if env and Path(env).is_file():
        return env
    return next((found for name in _BROWSERS if (found := shutil.which(name))), None)


@contextlib.contextmanager
def chromium(binary: str | None = None) -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed on exit."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise MissingDependency("playwright", "dev") from None
    binary = binary or find_chromium()
    if binary is None:
        raise BrowserError("no Chromium found: apt-get install chromium, or set CHROMIUM=/path/to/chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, args=list(FLAGS), headless=True)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, path: Path | str, width: int = 1280, height: int = 900, ready: str | None = None,
              timeout_ms: float = 60_000) -> Any:
    """A new page (``width`` × ``height`` CSS pixels) showing ``path``; every request that is not the file itself is
    refused and recorded. ``ready``: a JavaScript expression to wait for (the report's: every chart drawn).
    ``page.meshplan_errors`` lists the console errors and warnings (Vega's included), uncaught exceptions and refused
    or failed requests."""
    url = Path(path).resolve().as_uri()
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.meshplan_errors = errors
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type in ("error", "assert", "warning")
            else None)
    page.on("pageerror", lambda e: errors.append(f"exception: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))

    def only_the_file(route: Any) -> None:
        if route.request.url.split("#")[0] == url:
            route.continue_()
        else:
            errors.append(f"outside request: {route.request.url}")
            route.abort()

    page.route("**/*", only_the_file)
    page.goto(url, timeout=timeout_ms)
    if ready:
        page.wait_for_function(ready, timeout=timeout_ms)
    return page
