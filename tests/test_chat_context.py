"""The conversation belongs to its owner: a pooled LLM stage reads the context it is lent and keeps none of it."""
from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path

from conftest import ROOT
from s2s.chat_context import KEEP, ChatContext
from s2s.llm.base import LLMStage
from s2s.llm.echo import EchoLM
from s2s.llm.tools import ToolCall, Toolbox
from s2s.messages import Transcript
from s2s.server.pipelines import Pipeline
from tests.fixtures import weather_tools

TOOLS_MODULE = "tests.fixtures.weather_tools"


def pooled() -> tuple[Pipeline, EchoLM]:
    llm = EchoLM()
    llm.system_prompt, llm.history_turns = "Be brief.", 4
    return Pipeline(0, [("llm", llm)], {"system_prompt": llm.system_prompt}), llm


def test_a_lent_pipeline_answers_from_the_sessions_context_and_gives_nothing_of_it_to_the_next():
    pipeline, llm = pooled()
    first = pipeline.lend(log_content=False)
    first.system_prompt = "Answer like a pirate."  # the client's session.update instructions
    list(llm.process(Transcript("My name is Ada.", 0)))
    assert first.history() == [{"role": "user", "content": "My name is Ada."},
                               {"role": "assistant", "content": "My name is Ada."}]
    assert llm.chat_messages("Who am I?")[0] == {"role": "system", "content": "Answer like a pirate."}
    pipeline.release()

    second = pipeline.lend(log_content=False)
    assert second is not first and second.history() == []
    assert llm.chat_messages("Who am I?") == [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Who am I?"}]
    assert first.history()[0]["content"] == "My name is Ada."  # the first session's words stay with it


def test_a_reply_still_streaming_is_remembered_in_the_context_it_began_in():
    pipeline, llm = pooled()
    first = pipeline.lend(log_content=True)
    replies = llm.process(Transcript("Tell me a story.", 0))
    next(replies)
    second = pipeline.lend(log_content=True)  # what a release and a new borrower do meanwhile
    list(replies)
    assert [m["content"] for m in first.history()] == ["Tell me a story.", "Tell me a story."]
    assert second.history() == []


def test_a_turn_plan_and_the_context_tools_choose_the_turns_toolbox_in_that_order():
    llm = EchoLM()
    own, session, planned = (Toolbox(TOOLS_MODULE) for _ in range(3))
    llm._own_tools = own
    assert llm.toolbox() is own
    llm.context.tools = session
    assert llm.toolbox() is session and llm.toolbox(planned) is planned and llm.toolbox(None) is None
    llm.context.tools = None  # a session that took its tools away: none, not the stage's own
    assert llm.toolbox() is None and llm.toolbox(KEEP) is None


def test_the_window_keeps_whole_exchanges_within_both_budgets_and_edits_hold():
    context = ChatContext()
    for turn, words in enumerate(["a" * 40, "b" * 16, "c" * 8]):
        context.remember(turn, words, "ok")
    four_chars = lambda text: -(-len(text) // 4)  # noqa: E731
    assert [m["content"][0] for m in context.window(2, None, four_chars)] == ["b", "o", "c", "o"]
    assert [m["content"][0] for m in context.window(10, 6, four_chars)] == ["c", "o"]  # 5+1 fit, 2+1 more do not
    context.edit(2, "assistant", None)  # the client deleted the reply
    assert context.window(1, None, four_chars) == [{"role": "user", "content": "c" * 8}]
    context.discard(2)
    assert [m["content"][0] for m in context.window(1, None, four_chars)] == ["b", "o"]


def test_tool_arguments_reach_the_log_only_when_the_context_allows_it(caplog):
    toolbox = Toolbox(TOOLS_MODULE)
    call = ToolCall("get_weather", {"city": "Secret Town"}, "c1")
    with caplog.at_level(logging.INFO, logger="s2s.llm.tools"):
        toolbox.run(call, log_content=False)
    assert weather_tools.CALLS[-1] == ("get_weather", {"city": "Secret Town"})  # it ran
    assert "get_weather" in caplog.text and "Secret Town" not in caplog.text and "sunny" not in caplog.text
    with caplog.at_level(logging.INFO, logger="s2s.llm.tools"):
        toolbox.run(call, log_content=True)
    assert "Secret Town" in caplog.text


# What the conversation is asked through: the context's methods, and the LLM stage's own over the context it is lent.
HISTORY_METHODS = {name for name, _ in inspect.getmembers(ChatContext, inspect.isfunction) if not name.startswith("_")}
HISTORY_METHODS |= {"discard", "chat_messages", "tool_messages", "toolbox"}
STAGE_NAMES = {"llm", "stage", "stages", "pipeline"}  # how the server's modules name a stage or what holds one


def reaches_into_a_stage(source: str) -> list[str]:
    """The places in ``source`` that call a history method on a stage or read a stage's ``context``."""
    found: dict[int, str] = {}  # by line: a call on ``llm.context`` is both
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HISTORY_METHODS:
            receiver = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr == "context" and isinstance(node.ctx, ast.Load):
            receiver = node.value
        else:
            continue
        names = {part.id for part in ast.walk(receiver) if isinstance(part, ast.Name)}
        names |= {part.attr for part in ast.walk(receiver) if isinstance(part, ast.Attribute)}
        if names & STAGE_NAMES:
            found.setdefault(node.lineno, ast.unparse(node))
    return [f"line {line}: {code}" for line, code in sorted(found.items())]


def test_the_walker_sees_a_stage_asked_for_history_however_it_is_reached():
    source = ("def f(self, stage, chat, clients):\n"
              "    self.pipeline.llm.remember(1, 'a', 'b')\n"
              "    dict(self.stages)['llm'].discard(2)\n"
              "    stage.chat_messages('hi')\n"
              "    self.llm.context.edit(1, 'user', None)\n"
              "    chat.remember(1, 'a', 'b')\n"  # the session's own context: fine
              "    clients.discard(self)\n"  # a set: fine
              "    self.llm.context = chat\n")  # lending it: fine (Pipeline.lend)
    assert [line.split(":")[0] for line in reaches_into_a_stage(source)] == ["line 2", "line 3", "line 4", "line 5"]


def test_no_server_module_asks_a_stage_for_its_history():
    """The session owns its ChatContext and edits that; Pipeline.lend hands it to the LLM stage, and nothing in
    s2s/server/ calls a history method on a stage or reads the context back off one."""
    found = {path.name: places for path in sorted((ROOT / "s2s" / "server").rglob("*.py"))
             if (places := reaches_into_a_stage(path.read_text()))}
    assert found == {}
    assert HISTORY_METHODS >= {"remember", "edit", "plan_turn", "history", "discard"}
    assert all(callable(getattr(LLMStage, name, None)) or callable(getattr(ChatContext, name, None))
               for name in HISTORY_METHODS)
