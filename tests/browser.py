"""Debian's chromium, headless, driven over the Chrome DevTools Protocol (a WebSocket, ``websockets``' sync client).

Only what the page's tests need: open a page, evaluate JavaScript (as a user gesture where the page needs one),
poll an expression until it holds or a deadline passes, grant or deny the microphone, take a screenshot. Every
wait has a deadline; a browser that does not start in time is an error, not a hang.
"""
from __future__ import annotations

import base64
import itertools
import json
import queue
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from realtime_server import open_websocket

BINARIES = ("chromium", "chromium-browser", "google-chrome")
LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def find_chromium() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class CDPError(AssertionError):
    pass


class Chromium:
    """A headless chromium whose fake microphone plays ``fake_audio`` (a 16-bit PCM WAV) once.

    Args:
        binary: the chromium executable.
        user_data_dir: an empty folder of its own (profile, permissions).
        fake_audio: what the fake microphone captures; ``%noloop``: once, then silence.
        microphone: False: the user refuses the microphone (no fake prompt that says yes; the page's origin is
            denied with :meth:`deny_microphone`).
        start_timeout_s: how long the browser may take to open its DevTools socket.
    """

    def __init__(self, binary: str, user_data_dir: Path, fake_audio: Path, microphone: bool = True,
                 start_timeout_s: float = 60) -> None:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--no-proxy-server", f"--user-data-dir={user_data_dir}",
                   *(["--use-fake-ui-for-media-stream"] if microphone else []),
                   "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={fake_audio}%noloop",
                   "--remote-debugging-port=0", "about:blank"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        found: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stderr, args=(found,), daemon=True).start()
        try:
            url = found.get(timeout=start_timeout_s)
        except queue.Empty:
            url = None
        if url is None:
            self.close()
            raise CDPError("chromium did not open its DevTools socket:\n" + "".join(self.log[-40:]))
        self.socket = open_websocket(url, max_size=64 * 2**20, open_timeout=20)
        self._ids = itertools.count(1)
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read_socket, daemon=True).start()

    def _read_stderr(self, found: queue.Queue[str | None]) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if match := LISTENING.search(line):
                found.put(match.group(1))
        found.put(None)

    def _read_socket(self) -> None:
        try:
            for frame in self.socket:
                message = json.loads(frame)
                if "id" in message:
                    with self._lock:
                        box = self._replies.get(message["id"])
                    if box is not None:
                        box.put(message)
        except Exception:  # the browser went away: pending calls time out with the log attached
            pass

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:
        """One CDP command; returns its result or raises :class:`CDPError` (an error reply or no reply in time)."""
        number = next(self._ids)
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._replies[number] = box
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.socket.send(json.dumps(message))
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise CDPError(f"{method}: no reply within {timeout} s") from None
        finally:
            with self._lock:
                self._replies.pop(number, None)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def page(self, width: int = 1100, height: int = 760) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                          "deviceScaleFactor": 1, "mobile": False})
        return page

    def deny_microphone(self, origin: str) -> None:
        """What a user's "Block" on the microphone prompt leaves behind for ``origin``."""
        self.call("Browser.setPermission", {"permission": {"name": "microphone"}, "origin": origin,
                                            "setting": "denied"})

    def close(self) -> None:
        try:
            self.socket.close()
        except Exception:
            pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


class Page:
    """One tab of :class:`Chromium`, attached with a flat session."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        return self.browser.call(method, params, self.session, timeout)

    def open(self, url: str, timeout: float = 30) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && !!window.s2sStats", timeout)

    def evaluate(self, expression: str, user_gesture: bool = False, timeout: float = 30) -> Any:
        """The JSON value of ``expression``; ``user_gesture``: run as if the user clicked (audio may start)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True, "userGesture": user_gesture}, timeout)
        if "exceptionDetails" in result:
            raise CDPError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, every_s: float = 0.25) -> Any:
        """Poll ``expression`` until it is truthy; returns its value, or fails with the page's state."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression!r} did not hold within {timeout} s; the page: {self.state()}")
            time.sleep(every_s)

    def state(self) -> dict[str, Any]:
        """window.s2sStats without its DOM references, and the message shown."""
        return json.loads(self.evaluate(
            "JSON.stringify({stats: window.s2sStats, message: document.getElementById('message').textContent},"
            " (key, value) => key === 'element' ? undefined : value)"))

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()", user_gesture=True)

    def type_into(self, selector: str, text: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).value = {json.dumps(text)}")

    def text(self, selector: str) -> str:
        return self.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? ''")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path
