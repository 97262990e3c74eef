"""A page as a person sees it: headless Chromium driven over the DevTools protocol (``--remote-debugging-pipe``).

``open_page(path, screenshot)`` loads a local HTML file, waits for its load event, and returns every image's
``naturalWidth`` (0: it did not load or decode), what the page logged (console errors, uncaught exceptions, failed
loads) and the page's size; it keeps a full-page screenshot. Standard library only: the protocol is JSON messages,
each ended by a NUL byte, on file descriptors 3 (to the browser) and 4 (from it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional


def chromium() -> Optional[str]:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@dataclass
class Page:
    images: List[Dict[str, Any]]  # alt, naturalWidth, naturalHeight, complete
    errors: List[str] = field(default_factory=list)
    width: int = 0
    height: int = 0


class _Browser:
    def __init__(self, profile: Path) -> None:
        to_browser_r, self._write = os.pipe()
        self._read, from_browser_w = os.pipe()
        # --no-sandbox: Chromium refuses to run as root otherwise (CI runs as root); its own profile dir keeps the
        # run from touching the user's

        def pipes_on_3_and_4() -> None:  # in the child, before exec: fresh copies first, so neither clobbers the other
            reading, writing = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            pass_fds=(3, 4), preexec_fn=pipes_on_3_and_4, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: List[Dict[str, Any]] = []

    def send(self, method: str, params: Optional[Dict[str, Any]] = None, session: Optional[str] = None,
             timeout: float = 60) -> Dict[str, Any]:
        self._next += 1
        message: Dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = self._receive(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"{method}: no answer from Chromium in {timeout:g} s")

    def wait_for(self, method: str, timeout: float = 60) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} from Chromium in {timeout:g} s")
            self.events.append(self._receive(deadline))

    def _receive(self, deadline: float) -> Dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)


def open_page(path: Path, screenshot: Path, profile: Path, width: int = 1400) -> Page:
    """Load ``path`` in headless Chromium; report its images and errors; keep a full-page screenshot."""
    browser = _Browser(profile)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired")
        probe = ("JSON.stringify({images: Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, "
                 "naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight})), "
                 "width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight})")
        result = browser.send("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session=session)
        facts = json.loads(result["result"]["value"])
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
            "x": 0, "y": 0, "width": facts["width"], "height": facts["height"], "scale": 1}}, session=session)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors = []
        for event in browser.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                errors.append(params.get("exceptionDetails", {}).get("text", "exception"))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                errors.append(params["entry"].get("text", ""))
        return Page(images=facts["images"], errors=errors, width=facts["width"], height=facts["height"])
    finally:
        browser.close()
