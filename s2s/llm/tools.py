"""Tool calling shared by the LLM backends: loading a tools module, running calls, the prompted format.

``llm.tools`` names an importable Python module (the user's own, trusted code: it is imported and run) with

- ``TOOLS``: a list of OpenAI function definitions,
  ``{"type": "function", "function": {"name": ..., "description": ..., "parameters": {JSON schema}}}``;
- ``call_tool(name: str, arguments: dict) -> Any``: runs one call; a non-string result is sent back as JSON.

API backends pass ``TOOLS`` natively. Local models whose chat template knows no tools get them in the system
prompt and answer in the Hermes/Qwen format ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, which
``ToolCallFilter`` takes out of the streamed text before anything is spoken.
"""
from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from s2s.text import TagFilter

log = logging.getLogger(__name__)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALLABLE = "call_tool"


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``id`` is the API's call id (generated for local models)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    raw_arguments: str = field(default="", compare=False)  # the model's own text, when it was not valid JSON


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    output: str
    error: bool
    seconds: float


class Toolbox:
    """The tools of one ``llm.tools`` module: definitions for the model and the function that runs them."""

    def __init__(self, module_name: str) -> None:
        self.module_name = module_name
        module = importlib.import_module(module_name)
        tools = getattr(module, "TOOLS", None)
        runner = getattr(module, CALLABLE, None)
        if not isinstance(tools, list) or not all(isinstance(t, dict) and "function" in t for t in tools):
            raise ValueError(f"llm.tools={module_name}: TOOLS must be a list of OpenAI function definitions "
                             f'({{"type": "function", "function": {{"name": ..., "parameters": ...}}}})')
        if not callable(runner):
            raise ValueError(f"llm.tools={module_name}: the module needs a function {CALLABLE}(name, arguments)")
        self.definitions: list[dict[str, Any]] = tools
        self._run: Callable[[str, dict[str, Any]], Any] = runner
        self.names = [tool["function"]["name"] for tool in tools]

    def responses_definitions(self) -> list[dict[str, Any]]:
        """The Responses API's flat form: ``{"type": "function", "name": ..., "parameters": ...}``."""
        return [{"type": "function", **tool["function"]} for tool in self.definitions]

    def run(self, call: ToolCall, log_content: bool = True) -> ToolResult:
        """Run one call; an unknown tool or an exception becomes an error result the model can read.

        ``log_content`` False (a server session whose operator does not log transcripts) logs only the tool's
        name and time, not its arguments or result."""
        start = time.perf_counter()
        if call.name not in self.names:
            output, error = f"error: unknown tool {call.name!r} (known: {', '.join(self.names)})", True
        elif call.raw_arguments:
            output, error = f"error: arguments are not valid JSON: {call.raw_arguments!r}", True
        else:
            try:
                result = self._run(call.name, call.arguments)
                output = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
                error = False
            except Exception as exc:  # the model hears about it and can answer anyway
                output, error = f"error: {type(exc).__name__}: {exc}", True
        seconds = time.perf_counter() - start
        if log_content:
            log.info("tool call %s(%s) -> %s", call.name, json.dumps(call.arguments, ensure_ascii=False), output)
        else:
            log.info("tool call %s (%.2f s%s)", call.name, seconds, ", failed" if error else "")
        return ToolResult(call, output, error, seconds)

    def system_prompt(self, system_prompt: str | None) -> str:
        """The prompted format for local models whose chat template has no tools section."""
        definitions = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in self.definitions)
        block = ("You can call these tools:\n" + definitions + "\nTo call one, answer only with "
                 f'{OPEN}{{"name": <tool name>, "arguments": {{...}}}}{CLOSE}. '
                 "A tool's result comes back as <tool_response>...</tool_response>.")
        return f"{system_prompt}\n\n{block}" if system_prompt else block


def parse_call(text: str, index: int) -> ToolCall:
    """``{"name": ..., "arguments": {...}}`` as a local model writes it inside <tool_call> tags."""
    try:
        value = json.loads(text)
        name, arguments = value["name"], value.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise TypeError("name must be a string and arguments an object")
        return ToolCall(name, arguments, f"call_{index}")
    except (ValueError, KeyError, TypeError):
        name = text.split('"name"', 1)[-1].split('"')[1] if '"name"' in text and text.count('"') > 3 else "?"
        return ToolCall(name, {}, f"call_{index}", raw_arguments=text.strip() or "(empty)")


def parse_arguments(name: str, arguments: str, call_id: str) -> ToolCall:
    """An API's tool call, whose arguments arrive as a JSON string."""
    try:
        value = json.loads(arguments or "{}")
        if isinstance(value, dict):
            return ToolCall(name, value, call_id)
    except ValueError:
        pass
    return ToolCall(name, {}, call_id, raw_arguments=arguments or "(empty)")


class ToolCallFilter(TagFilter):
    """Takes ``<tool_call>...</tool_call>`` out of streamed text: text before it streams on, calls come at the end."""

    def __init__(self) -> None:
        super().__init__(OPEN, CLOSE)

    @property
    def calls(self) -> list[ToolCall]:
        return [parse_call(block, index) for index, block in enumerate(self.blocks)]


def check_module(tools: str | None, key: str = "llm.tools") -> None:
    """Validation before loading: the module must be findable (it is imported only in ``setup``)."""
    import importlib.util

    from s2s.config_errors import ConfigError

    if tools is None:
        return
    try:
        found = importlib.util.find_spec(tools) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(key, tools, f"an importable Python module with TOOLS and {CALLABLE}(name, arguments), "
                                      "e.g. s2s.llm.example_tools")


class TemplateTools:
    """Tool calling for local chat models (transformers, mlx-lm), mixed in before ``LLMStage``.

    A chat template that renders tools (Qwen2.5, Llama 3.1, Hermes, SmolLM3...) gets them natively through
    ``apply_chat_template(tools=...)``; any other gets the prompted format in its system prompt. Either way the
    model answers ``<tool_call>{...}</tool_call>``, which the backend's stream passes through ``ToolCallFilter``.
    """

    _toolbox: Toolbox | None
    _tokenizer: Any

    def _native_tools(self) -> bool:
        """Whether the model's chat template renders tools itself."""
        return self._toolbox is not None and "tools" in str(self._tokenizer.chat_template or "")

    def _template_tools(self) -> dict[str, Any]:
        """Extra ``apply_chat_template`` arguments: the tools, for templates that render them."""
        return {"tools": self._toolbox.definitions} if self._toolbox and self._native_tools() else {}

    def _with_tools(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The prompted format: tools and the call syntax in the system prompt, for templates without tools."""
        if self._toolbox is None or self._native_tools():
            return messages
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": self._toolbox.system_prompt(messages[0]["content"])}, *messages[1:]]
        return [{"role": "system", "content": self._toolbox.system_prompt(None)}, *messages]

    def tool_messages(self, calls: list[ToolCall], results: list[ToolResult]) -> list[dict[str, Any]]:
        if self._native_tools():  # chat templates take arguments as a mapping, not the API's JSON string
            return [{"role": "assistant", "content": "",
                     "tool_calls": [{"id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": call.arguments}} for call in calls]},
                    *({"role": "tool", "tool_call_id": r.call.id, "content": r.output} for r in results)]
        said = "".join(f"{OPEN}{json.dumps({'name': call.name, 'arguments': call.arguments})}{CLOSE}" for call in calls)
        heard = "".join(f"<tool_response>{result.output}</tool_response>" for result in results)
        return [{"role": "assistant", "content": said}, {"role": "user", "content": heard}]
