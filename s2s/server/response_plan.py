"""What one ``response.create`` changes for its turn alone, judged before the turn starts.

The plan reaches the stages through the session's conversation (:meth:`ChatContext.plan_turn
<s2s.chat_context.ChatContext.plan_turn>`): the LLM reads its instructions, tools, history rule and token cap,
and hands its voice and modality on with each piece of reply text, so the pooled stages keep nothing of it.
"""
from __future__ import annotations

from typing import Any

from s2s.chat_context import KEEP
from s2s.llm.base import LLMStage
from s2s.server.protocol import Item, ProtocolError, ResponseRequest
from s2s.server.session_settings import SessionSettings, StageRules
from s2s.server.tools import ToolBridge


def plan_response(request: ResponseRequest, settings: SessionSettings, rules: StageRules, llm: Any,
                  tools: ToolBridge, eid: str | None) -> dict[str, Any] | None:
    """The keywords of ``ChatContext.plan_turn`` for this response (None: it asks for nothing of its own).

    Raises:
        ProtocolError: a part of the request the session's stages cannot do (nothing is planned).
    """
    if request.output_rate is not None and request.output_rate != settings.output_rate:
        raise ProtocolError("invalid_value", f"'response.audio.output.format' rate {request.output_rate} is not the "
                            f"session's ({settings.output_rate} Hz): one output format per session; change it with "
                            f"session.update", "response.audio.output.format", eid)
    voice = request.voice
    if voice is not None and (voice == settings.voice or rules.builtin_voice(voice, settings.voice)):
        voice = None  # the session's own, or an SDK's default name this TTS lacks: the session's voice says it
    if voice is not None and (problem := rules.response_voice_problem(voice)):
        raise ProtocolError("invalid_value", problem, "response.audio.output.voice", eid)
    if request.instructions is None and request.tools is None and request.tool_choice is None and voice is None \
            and not request.out_of_band and request.text_only is None and request.max_output_tokens is None:
        return None
    if not isinstance(llm, LLMStage):
        raise ProtocolError("invalid_value", f"llm {type(llm).__name__} takes no per-response instructions, tools, "
                                             f"voice or token cap", "response", eid)
    toolbox: Any = KEEP
    if request.tools is not None or request.tool_choice is not None:
        offered = settings.tools if request.tools is None else request.tools
        if problem := tools.problem(offered):
            raise ProtocolError("tools_not_supported", problem, "response.tools", eid)
        choice = request.tool_choice or "auto"
        if isinstance(choice, dict) and choice["name"] not in [tool["name"] for tool in offered]:
            raise ProtocolError("invalid_value", f"tool_choice names '{choice['name']}', which is not one of the "
                                                 f"tools", "response.tool_choice.name", eid)
        toolbox = tools.toolbox(offered, choice)
    tokens = request.max_output_tokens
    return {"instructions": KEEP if request.instructions is None else request.instructions, "toolbox": toolbox,
            "remember": not request.out_of_band,
            "spoken": KEEP if request.text_only is None else not request.text_only, "voice": voice,
            "max_tokens": KEEP if tokens is None else None if tokens == "inf" else tokens}


def typed_turn_text(items: list[Item], tools: ToolBridge) -> str:
    """The user text of a typed turn: the input_text items, and each function output named by its call."""
    parts = []
    for item in items:
        call = tools.call(item.call_id or "") if item.kind == "function_call_output" else None
        parts.append(item.text if call is None else f"The result of {call.name}({call.arguments}) is: {item.text}")
    return "\n".join(parts)
