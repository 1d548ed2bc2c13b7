"""Open a page in headless Chromium and ask it what it rendered: for the report's browser test and the
screenshots in the docs. No Python dependency: the Chrome DevTools Protocol over a pipe
(``--remote-debugging-pipe``: JSON messages separated by NUL bytes; the browser reads file descriptor 3
and writes 4).

    with Chromium() as browser:
        page = browser.open(Path("report.html"))
        page.evaluate("document.title")
        page.errors            # console errors, uncaught exceptions and failed loads, as text
        page.screenshot(Path("shot.png"), selector="#chart-timeline")

``find_chromium()`` returns the binary (``$CHROMIUM``, then chromium / chromium-browser / google-chrome on
PATH) or None, so callers can skip with a reason.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--mute-audio", "--hide-scrollbars")


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    pass


class Chromium:
    """A headless Chromium process driven over the DevTools pipe; a context manager."""

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 900, timeout: float = 60.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no Chromium found (apt-get install chromium, or set CHROMIUM=/path/to/chrome)")
        self.width, self.height, self.timeout = width, height, timeout
        self._id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="meshplan-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        def child() -> None:  # in the forked child, before exec: the browser's pipe ends on fds 3 and 4
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [self.binary, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=child)  # os.pipe ends are close-on-exec; fds 3 and 4 are not
        os.close(to_browser_r)
        os.close(from_browser_w)
        return self

    def __exit__(self, *exc: object) -> bool:
        with contextlib.suppress(BrowserError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()
        return False

    # ---- protocol ------------------------------------------------------------------------------------------------
    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (status {self.proc.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        """Send one command and wait for its answer; events that arrive meanwhile go to ``events``."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str | None, timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            event = self._read(deadline)
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def open(self, path: Path | str, settle: float = 0.2) -> Page:
        """Load a file (or URL) in a new tab and wait for its load event."""
        url = Path(path).resolve().as_uri() if not str(path).startswith(("file:", "http:", "https:", "about:")) \
            else str(path)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session)
        time.sleep(settle)
        return Page(self, session)


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluate: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    @property
    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries and failed requests of this page so far."""
        self.evaluate("0")  # flush pending events
        out = []
        for e in self.browser.events:
            if e.get("sessionId") != self.session:
                continue
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                out.append(f"exception: {details.get('text', '')} "
                           f"{details.get('exception', {}).get('description', '')}".strip())
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                out.append("log: " + params["entry"].get("text", ""))
            elif method == "Network.loadingFailed":
                out.append("network: " + params.get("errorText", ""))
        return out

    @property
    def requests(self) -> list[str]:
        """URLs the page requested (the document itself included)."""
        return [e["params"]["request"]["url"] for e in self.browser.events
                if e.get("sessionId") == self.session and e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path | str, selector: str | None = None, full_page: bool = False,
                   padding: int = 8) -> Path:
        """A PNG of the viewport, of the whole page, or of one element (by CSS selector)."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page or selector is not None}
        if selector is not None:
            box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                                ".getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, "
                                "r.height]; })()")
            x, y, w, h = box
            params["clip"] = {"x": max(0, x - padding), "y": max(0, y - padding), "width": w + 2 * padding,
                              "height": h + 2 * padding, "scale": 1}
        elif full_page:
            w, h = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
        data = self.browser.send("Page.captureScreenshot", params, session=self.session)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path


# JavaScript that describes every chart of a report: its id, drawn size, and how many shapes it holds.
CHARTS_JS = """
Array.from(document.querySelectorAll('figure.chart')).map(f => {
  const svg = f.querySelector('svg'); const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  let box = {width: 0, height: 0}; try { box = svg.getBBox(); } catch (e) {}
  return {id: f.id, width: r.width, height: r.height, bboxWidth: box.width, bboxHeight: box.height,
          shapes: svg ? svg.querySelectorAll('path, use, rect, line, polyline').length : 0,
          texts: svg ? svg.querySelectorAll('g[id^="text"], g[id*="-text"]').length : 0};
})
"""
