"""Tool calling with llm=transformers (native template tools and the prompted format) on tiny overfitted LMs
that deterministically answer with one tool call; the <tool_call> filter; the transcript records every call."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from conftest import CACHE, compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.llm.tools import ToolCall, ToolCallFilter, Toolbox
from s2s.llm.transformers_lm import TransformersLM
from s2s.graph import Graph
from s2s.messages import Data, Message, ReplyText, SpeechSegment, Transcript, TurnEnd
from s2s.metrics import Recorder
from s2s.stage import Stage
from tests.fixtures import llm_models, weather_tools

TOOLS_MODULE = "tests.fixtures.weather_tools"


@pytest.fixture(scope="module", params=["native", "prompted"])
def stage(request):
    stage = TransformersLM(model=str(llm_models.tool_lm(request.param, CACHE / "models")), device="cpu",
                           system_prompt=None, history_turns=2, max_new_tokens=48, tools=TOOLS_MODULE)
    stage.setup()
    yield stage
    stage.close()


def test_the_call_runs_its_result_goes_back_and_the_follow_up_is_spoken(stage):
    weather_tools.CALLS.clear()
    stage.reset()
    native = stage._native_tools()
    assert native == ("prompted" not in stage.model_name)
    out = list(stage.process(Transcript(weather_tools.QUESTION, 0, "en")))
    assert weather_tools.CALLS == [("get_weather", {"city": "Paris"})]
    # a short first chunk (4 words), the rest of its sentence, then whole sentences
    assert [m.text for m in out if isinstance(m, ReplyText)] == ["It is sunny in", "Paris today.", "Enjoy the sun!"]
    assert out[-1] == TurnEnd(0)
    # the history keeps the spoken exchange, not the tool round trip
    assert stage.chat_messages("next")[:2] == [{"role": "user", "content": weather_tools.QUESTION},
                                                {"role": "assistant", "content": weather_tools.FOLLOW_UP}]



class Asker(Stage):
    """An STT stand-in for the runner test: every utterance is the weather question."""

    accepts = (SpeechSegment,)
    emits = (Transcript,)

    def process(self, message: Data) -> Iterator[Message]:
        yield Transcript(weather_tools.QUESTION, message.turn, "en")


def test_the_runner_records_every_call_and_result_in_the_transcript(stage, tmp_path):
    from graph_stages import Collector, CountingSource, Segmenter, Voice

    stage.reset()
    graph = Graph([("source", CountingSource(turns=1)), ("vad", Segmenter()), ("stt", Asker()), ("llm", stage),
                   ("tts", Voice()), ("sink", Collector())], observer=Recorder(tmp_path))
    graph.setup()
    try:
        assert graph.run().status == "completed"
    finally:
        graph.close()
    [line] = [json.loads(text) for text in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    [event] = [event for event in line["events"] if event["event"] == "tool_call"]  # the reply's confidence too
    assert {k: v for k, v in event.items() if k != "seconds"} == {
        "event": "tool_call", "tool": "get_weather", "arguments": {"city": "Paris"},
        "result": weather_tools.RESULT, "error": False}
    assert line["user"] == weather_tools.QUESTION and line["assistant"] == weather_tools.FOLLOW_UP
    assert "tool_call" not in line["reported"]


def test_the_prompted_format_puts_the_tools_in_the_system_prompt():
    prompt = Toolbox(TOOLS_MODULE).system_prompt("Be brief.")
    assert prompt.startswith("Be brief.\n\nYou can call these tools:\n")
    assert json.dumps(weather_tools.TOOLS[0]["function"]) in prompt and "<tool_call>" in prompt


def test_the_filter_streams_text_and_takes_calls_out_even_across_pieces():
    calls = ToolCallFilter()
    pieces = ["Let me check. <to", "ol_call>{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Oslo\"}}</tool",
              "_call> Done <", "b>"]
    spoken = [text for piece in pieces for text in calls.feed(piece)]
    spoken += list(calls.finish())
    assert "".join(spoken) == "Let me check.  Done <b>"
    assert spoken[0] == "Let me check. "  # streamed before the call was complete
    assert calls.calls == [ToolCall("get_weather", {"city": "Oslo"}, "call_0")]


def test_an_unclosed_call_at_the_end_of_the_reply_still_counts():
    calls = ToolCallFilter()
    assert list(calls.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}')) == []
    assert list(calls.finish()) == []
    assert calls.calls == [ToolCall("get_weather", {"city": "Rome"}, "call_0")]


def test_bad_calls_become_error_results_the_model_can_read():
    toolbox = Toolbox(TOOLS_MODULE)
    calls = ToolCallFilter()
    list(calls.feed('<tool_call>{"name": "get_weather", "arguments": {city: Rome}}</tool_call>'))
    [broken] = calls.calls
    assert toolbox.run(broken).output.startswith("error: arguments are not valid JSON")
    unknown = toolbox.run(ToolCall("launch_rocket", {}, "c"))
    assert unknown.error and "unknown tool 'launch_rocket' (known: get_weather)" in unknown.output
    failing = toolbox.run(ToolCall("get_weather", {}, "c"))  # call_tool raises KeyError: 'city'
    assert failing.error and failing.output == "error: KeyError: 'city'"


@pytest.mark.parametrize("option", ["transformers", "openai"])
def test_a_tools_module_that_is_not_importable_is_refused_before_loading(option, tmp_path):
    with pytest.raises(ConfigErrors, match="llm.tools=nowhere.tools: invalid; expected an importable Python module"):
        validate(compose_config([f"llm={option}", "llm.tools=nowhere.tools"], tmp_path))
    specs = validate(compose_config([f"llm={option}", "llm.tools=s2s.llm.example_tools"], tmp_path))
    assert next(s for s in specs if s.group == "llm").kwargs["tools"] == "s2s.llm.example_tools"


def test_the_example_tools_module_follows_the_contract():
    from s2s.llm import example_tools

    toolbox = Toolbox("s2s.llm.example_tools")
    assert toolbox.names == ["get_time"]
    result = json.loads(toolbox.run(ToolCall("get_time", {"timezone": "UTC"}, "c")).output)
    assert result["timezone"] == "UTC" and len(result["time"]) == 5
    assert example_tools.call_tool("get_time", {"timezone": "Mars/Olympus"}) == {
        "error": "unknown time zone 'Mars/Olympus'"}
