"""Tools a client declares in ``session.update``: the LLM calls them, the client runs them.

A :class:`ClientToolbox` stands where an ``llm.tools`` module's :class:`~s2s.llm.tools.Toolbox` would (same
definitions, same prompted format, same ``run``), so every LLM backend's tool calling works unchanged. Its
``run`` hands the call to the session, which sends ``response.function_call_arguments.done`` and ends that
response; the LLM's thread then waits until the client's ``function_call_output`` arrives with the next
``response.create``, and the reply goes on in the same turn, as a new response.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from s2s.llm.base import LLMStage
from s2s.llm.tools import ToolCall, Toolbox, ToolResult
from s2s.server.protocol import new_id

WAIT_S = 120.0  # the longest an LLM waits for a client's function_call_output


class ClientToolbox(Toolbox):
    """The session's tools, run by the client.

    Args:
        tools: function tools as ``session.update`` gives them (``{"type", "name", "description", "parameters"}``).
        announce: called (in the LLM's thread) with ``(call_id, call)`` when the model makes a call.
        wait_s: how long a call waits for its output before the model hears that none came.
    """

    def __init__(self, tools: list[dict[str, Any]], announce: Callable[[str, ToolCall], None],
                 wait_s: float = WAIT_S) -> None:
        self.module_name = "session.tools"
        self.definitions = [{"type": "function", "function": {key: tool[key] for key in
                                                               ("name", "description", "parameters")}}
                            for tool in tools]
        self.names = [tool["name"] for tool in tools]
        self._announce, self._wait_s = announce, wait_s
        self._waiting: dict[str, tuple[threading.Event, list[str]]] = {}
        self._lock = threading.Lock()

    def run(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        if call.name not in self.names or call.raw_arguments:
            return super().run(call)  # the model hears the error and can answer anyway
        with self._lock:
            call_id = new_id("call")
            done, slot = self._waiting[call_id] = (threading.Event(), [])
        self._announce(call_id, call)
        answered = done.wait(self._wait_s)
        with self._lock:
            self._waiting.pop(call_id, None)
        output = slot[0] if answered and slot else "error: the client sent no output for this call"
        return ToolResult(call, output, not (answered and slot), time.perf_counter() - start)

    def waiting(self, call_id: str) -> bool:
        with self._lock:
            return call_id in self._waiting

    def deliver(self, call_id: str, output: str) -> bool:
        """The client's output for ``call_id``; False when no call waits for it (any more)."""
        with self._lock:
            entry = self._waiting.get(call_id)
        if entry is None:
            return False
        entry[1].append(output)
        entry[0].set()
        return True

    def release(self) -> None:
        """Wake every waiting call (cancelled reply, session gone): the LLM thread must not hang."""
        with self._lock:
            entries = list(self._waiting.values())
        for done, _ in entries:
            done.set()


def accepts_client_tools(llm: Any) -> str | None:
    """Why this LLM stage cannot take client tools, or None when it can."""
    if not isinstance(llm, LLMStage):
        return f"llm {type(llm).__name__} has no tool calling"
    if llm.tools:
        return f"this server's LLM runs its own tools (llm.tools={llm.tools}); client tools would mix with them"
    return None
