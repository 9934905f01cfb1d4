"""Tools a client declares in ``session.update``: the LLM calls them, the client runs them.

A :class:`ClientToolbox` stands where an ``llm.tools`` module's :class:`~s2s.llm.tools.Toolbox` would (same
definitions, same prompted format, same ``run``), so every LLM backend's tool calling works unchanged. Its
``run`` hands the call to the session, which sends ``response.function_call_arguments.done`` and ends that
response; the LLM's thread then waits until the client's ``function_call_output`` arrives with the next
``response.create``, and the reply goes on in the same turn, as a new response.

A :class:`ToolBridge` is the session's side of it: it installs the toolbox in the LLM while the session has
tools, and remembers every call the client was told of (its name, arguments and turn).
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from s2s.chat_context import ChatContext
from s2s.llm.base import LLMStage
from s2s.llm.tools import ToolCall, Toolbox, ToolResult
from s2s.server.outbox import ToolCalled
from s2s.server.protocol import new_id

WAIT_S = 120.0  # the longest an LLM waits for a client's function_call_output


class Waits:
    """The calls waiting for the client's output, shared by a session's toolboxes (its own, a response's)."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[threading.Event, list[str]]] = {}
        self._lock = threading.Lock()

    def open(self) -> tuple[str, threading.Event, list[str]]:
        with self._lock:
            call_id = new_id("call")
            done, slot = self._waiting[call_id] = (threading.Event(), [])
        return call_id, done, slot

    def close(self, call_id: str) -> None:
        with self._lock:
            self._waiting.pop(call_id, None)

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


class ClientToolbox(Toolbox):
    """The session's tools, run by the client.

    Args:
        tools: function tools as ``session.update`` gives them (``{"type", "name", "description", "parameters"}``).
        announce: called (in the LLM's thread) with ``(call_id, call)`` when the model makes a call.
        wait_s: how long a call waits for its output before the model hears that none came.
        waits: the session's waiting calls (a toolbox of its own when None).
    """

    def __init__(self, tools: list[dict[str, Any]], announce: Callable[[str, ToolCall], None],
                 wait_s: float = WAIT_S, waits: Waits | None = None) -> None:
        self.module_name = "session.tools"
        self.definitions = [{"type": "function", "function": {key: tool[key] for key in
                                                               ("name", "description", "parameters")}}
                            for tool in tools]
        self.names = [tool["name"] for tool in tools]
        self._announce, self._wait_s = announce, wait_s
        self.waits = waits or Waits()

    def run(self, call: ToolCall, log_content: bool = True) -> ToolResult:
        start = time.perf_counter()
        if call.name not in self.names or call.raw_arguments:
            return super().run(call, log_content)  # the model hears the error and can answer anyway
        call_id, done, slot = self.waits.open()
        self._announce(call_id, call)
        answered = done.wait(self._wait_s)
        self.waits.close(call_id)
        output = slot[0] if answered and slot else "error: the client sent no output for this call"
        return ToolResult(call, output, not (answered and slot), time.perf_counter() - start)

    def waiting(self, call_id: str) -> bool:
        return self.waits.waiting(call_id)

    def deliver(self, call_id: str, output: str) -> bool:
        """The client's output for ``call_id``; False when no call waits for it (any more)."""
        return self.waits.deliver(call_id, output)

    def release(self) -> None:
        """Wake every waiting call (cancelled reply, session gone): the LLM thread must not hang."""
        self.waits.release()


def accepts_client_tools(llm: Any) -> str | None:
    """Why this LLM stage cannot take client tools, or None when it can."""
    if not isinstance(llm, LLMStage):
        return f"llm {type(llm).__name__} has no tool calling"
    if llm.tools:
        return f"this server's LLM runs its own tools (llm.tools={llm.tools}); client tools would mix with them"
    return None


@dataclass(frozen=True)
class Call:
    """A call the client was told of: its function, its arguments (JSON text) and the turn it belongs to."""

    call_id: str
    name: str
    arguments: str
    turn: int


class ToolBridge:
    """The session's client tools: the toolbox in its conversation, and the calls made so far.

    Args:
        llm: the session's pooled LLM stage (asked whether it can take client tools).
        chat: the session's conversation, which holds the tools offered to the model.
        announce: called (in the LLM's thread) with each call the model makes, to tell the client.
    """

    def __init__(self, llm: Any, chat: ChatContext, announce: Callable[[ToolCalled], None]) -> None:
        self.llm, self.chat, self._announce = llm, chat, announce
        self._toolbox: ClientToolbox | None = None
        self._waits = Waits()
        self._calls: dict[str, Call] = {}

    def problem(self, tools: list[dict[str, Any]]) -> str | None:
        """Why the LLM cannot take ``tools``, or None (an empty list is always fine: it takes tools away)."""
        return accepts_client_tools(self.llm) if tools else None

    def toolbox(self, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]) -> ClientToolbox | None:
        """What the model is offered: none for tool_choice none, only the named one for ``{"type": "function"}``."""
        if isinstance(tool_choice, dict):
            tools = [tool for tool in tools if tool["name"] == tool_choice["name"]]
        if not tools or tool_choice == "none":
            return None
        return ClientToolbox(tools, self._called, waits=self._waits)

    def install(self, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]) -> None:
        """Hand ``tools`` to the LLM (or take them away), from its next turn on; waiting calls are woken."""
        self.release()
        toolbox = self.toolbox(tools, tool_choice)
        if toolbox is not None or self._toolbox is not None:
            self._toolbox = toolbox
            self.chat.tools = toolbox

    def _called(self, call_id: str, call: ToolCall) -> None:
        self._announce(ToolCalled(call_id, call.name, json.dumps(call.arguments, ensure_ascii=False)))

    def record(self, call: ToolCalled, turn: int) -> None:
        """The client was told of ``call`` as part of the reply to ``turn``."""
        self._calls[call.call_id] = Call(call.call_id, call.name, call.arguments, turn)

    def call(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def waiting(self, call_id: str) -> bool:
        """The LLM waits for this call's output (it has not timed out or been released)."""
        return self._waits.waiting(call_id)

    def deliver(self, call_id: str, output: str) -> bool:
        """The client's output for a waiting call; False when it came too late."""
        return self._waits.deliver(call_id, output)

    def release(self) -> None:
        """Wake every waiting call (its reply was cancelled): the LLM's thread must not hang."""
        self._waits.release()

    def close(self) -> None:
        """The session ends: wake waiting calls and take the tools away (its conversation is not lent again)."""
        self._waits.release()
        if self._toolbox is not None:
            self._toolbox = None
            self.chat.tools = None
