"""A real realtime server in a subprocess (``run.py server=realtime`` on 127.0.0.1) and helpers to talk to it."""
from __future__ import annotations

import base64
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio

ROOT = Path(__file__).resolve().parent.parent
RATE = 24000
READY = re.compile(r"listening on ws://127\.0\.0\.1:(\d+)/v1/realtime")
API_KEY = "test-key-0123456789"


class RunningServer:
    """``python run.py server=realtime server.port=0 <overrides>``; ``stop()`` sends SIGTERM, then kills."""

    def __init__(self, run_dir: Path, *overrides: str, env: dict[str, str] | None = None,
                 start_timeout_s: float = 400, entry: list[str] | None = None, cwd: Path = ROOT) -> None:
        self.run_dir = run_dir
        entry = entry or [sys.executable, str(ROOT / "run.py"), "server=realtime"]  # or: python -m s2s serve
        command = [*entry, "server.host=127.0.0.1", "server.port=0", f"hydra.run.dir={run_dir}", *overrides]
        self.process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self._ready: queue.Queue[int | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            port = self._ready.get(timeout=start_timeout_s)
        except queue.Empty:
            self.stop()
            raise AssertionError("the server did not start in time:\n" + self.output[-4000:]) from None
        if port is None:
            raise AssertionError("the server exited before listening:\n" + self.output[-4000:])
        self.port = port
        self.url = f"ws://127.0.0.1:{port}/v1/realtime"
        self.http = f"http://127.0.0.1:{port}"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if found := READY.search(line):
                self._ready.put(int(found.group(1)))
        self._ready.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def alive(self) -> bool:
        return self.process.poll() is None

    def get(self, path: str, api_key: str | None = API_KEY) -> tuple[int, Any]:
        request = urllib.request.Request(self.http + path)
        if api_key:
            request.add_header("Authorization", f"Bearer {api_key}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def wait_idle(self, timeout_s: float = 30) -> None:
        """Until no session is active (a closed client's session is freed just after it goes)."""
        deadline = time.monotonic() + timeout_s
        while self.get("/v1/sessions")[1].get("active") and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode


class Events:
    """Every event of an ``openai`` SDK realtime connection, read in a thread, so waits have deadlines."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.all: list[Any] = []
        self._queue: queue.Queue[Any] = queue.Queue()
        self.closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for event in self.connection:
                self._queue.put(event)
        except Exception as error:  # the connection ended badly: waiting code sees it as closed
            self._queue.put(error)
        finally:
            self.closed.set()
            self._queue.put(None)

    def next(self, timeout: float = 60) -> Any:
        try:
            event = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout} s; so far: {[e.type for e in self.all]}") from None
        if event is not None and not isinstance(event, Exception):
            self.all.append(event)
        return event

    def until(self, kind: str, timeout: float = 120, where: Any = None) -> Any:
        """Read until an event of ``kind`` (matching ``where``) arrives; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.next(max(0.1, deadline - time.monotonic()))
            if event is None or isinstance(event, Exception):
                raise AssertionError(f"connection ended waiting for {kind}: {event!r}; "
                                     f"got {[e.type for e in self.all]}")
            if event.type == kind and (where is None or where(event)):
                return event

    def of(self, kind: str) -> list[Any]:
        return [event for event in self.all if event.type == kind]


def open_websocket(url: str, **options: Any) -> Any:
    """``websockets``' sync client connection, open, that the caller closes: entered as a context manager, the way
    websockets 17 asks (it warns about a bare ``connect()`` and will stop returning a connection from it)."""
    from websockets.sync.client import connect

    return connect(url, **options).__enter__()


def pcm16(path: Path, rate: int = RATE, trailing_silence_s: float = 1.5) -> np.ndarray:
    samples = audio.read_audio(path, rate)
    return audio.float_to_int16(np.concatenate([samples, audio.silence(trailing_silence_s, rate)]))


def send_speech(connection: Any, samples: np.ndarray, rate: int = RATE, chunk_s: float = 0.1,
                paced: bool = False) -> None:
    """Append ``samples`` (PCM16) in ``chunk_s`` pieces: at once, or ``paced`` as a microphone would send them."""
    step = int(rate * chunk_s)
    for start in range(0, len(samples), step):
        connection.input_audio_buffer.append(audio=base64.b64encode(samples[start:start + step].tobytes()).decode())
        if paced:
            time.sleep(chunk_s)


def reply_audio(events: list[Any], response_id: str | None = None) -> np.ndarray:
    blocks = [np.frombuffer(base64.b64decode(e.delta), dtype="<i2") for e in events
              if e.type == "response.output_audio.delta" and (response_id is None or e.response_id == response_id)]
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int16)


def openai_client(server: RunningServer, api_key: str = API_KEY) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.http}/v1", api_key=api_key)
