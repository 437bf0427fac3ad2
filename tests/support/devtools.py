"""A tiny DevTools-protocol client: headless Chromium driven over `--remote-debugging-pipe`.

Chromium reads commands from its file descriptor 3 and writes replies and events to descriptor 4,
one JSON message per NUL-terminated chunk. Over that pipe a test opens a page, sees every request
the page makes (Network events, file:// ones included), its console errors and uncaught exceptions,
evaluates a script in it and takes a screenshot: one browser start for many pages, no port, no network.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.render.export import find_chromium
from tests.support.html_check import CHROMIUM_FLAGS

FLAGS = (
    *CHROMIUM_FLAGS,  # headless, offline, WebGL (plotly's scattergl) in software without a GPU
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    # Any host name resolves to nothing: a page that tries the network fails fast instead of waiting.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--remote-debugging-pipe",
)


class BrowserError(RuntimeError):
    """Chromium could not be started, died, or did not answer in time."""


@dataclass
class PageLog:
    """What the page did while it loaded: every request URL, console errors, uncaught exceptions."""

    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def record(self, method: str, params: dict) -> None:
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.errors.append(f"uncaught: {text}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}".strip())

    def network(self) -> list[str]:
        """Requests that left the machine's files: anything not file:, data: or blob:."""
        return [u for u in self.requests if not u.startswith(("file:", "data:", "blob:", "about:"))]


class Browser:
    """One headless Chromium; `with Browser() as b: b.open(page)`."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout_s: float = 60.0) -> None:
        exe = find_chromium()
        if exe is None:
            raise BrowserError("no chromium on PATH (bash scripts/install_chromium.sh installs it)")
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self._profile = tempfile.TemporaryDirectory(prefix="devtools_")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_fds() -> None:  # in the child: its fd 3 reads our commands, fd 4 writes its replies
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        profile = self._profile.name
        self._proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=wire_fds,
            env={**os.environ, "HOME": profile},
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[tuple[str, dict, str | None]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._send("Browser.close")
                self._proc.wait(timeout=10)
            except (BrowserError, OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"chromium did not answer within {self.timeout_s:.0f} s")
            ready, _, _ = select.select([self._from_browser], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium closed its pipe (exit code {self._proc.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._read_message(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})
            if "method" in message:
                self._events.append((message["method"], message.get("params", {}), message.get("sessionId")))

    def wait_for(self, method: str, session: str) -> None:
        """Read events until `method` arrives for this session."""
        deadline = time.monotonic() + self.timeout_s
        while not any(m == method and s == session for m, _, s in self._events):
            message = self._read_message(deadline)
            if "method" in message:
                self._events.append((message["method"], message.get("params", {}), message.get("sessionId")))

    def open(self, page: Path, width: int | None = None, height: int | None = None) -> Tab:
        """Open a page in a new tab, of the window's size unless given, and wait for its load event."""
        width, height = width or self.width, height or self.height
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network", "Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        self._events.clear()
        self.call("Page.navigate", {"url": Path(page).resolve().as_uri()}, session=session)
        self.wait_for("Page.loadEventFired", session)
        return Tab(self, session, target)

    def take_log(self, session: str) -> PageLog:
        log = PageLog()
        for method, params, owner in self._events:
            if owner == session:
                log.record(method, params)
        return log


@dataclass
class Tab:
    """An open page."""

    browser: Browser
    session: str
    target: str = ""

    def close(self) -> None:
        """Close the tab (a browser kept for many pages would otherwise hold them all)."""
        if self.target:
            self.browser.call("Target.closeTarget", {"targetId": self.target})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise)."""
        result = self.browser.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=self.session,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    def log(self) -> PageLog:
        return self.browser.take_log(self.session)

    def screenshot(self, path: Path, clip: tuple[float, float, float, float] | None = None) -> Path:
        """A PNG of the viewport, or of the page's box (left, top, width, height) in page pixels, which
        may reach beyond the viewport."""
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            x, y, w, h = clip
            params |= {"captureBeyondViewport": True, "clip": {"x": x, "y": y, "width": w, "height": h, "scale": 1}}
        data = self.browser.call("Page.captureScreenshot", params, session=self.session)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
