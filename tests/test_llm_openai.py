"""llm=openai against real servers on 127.0.0.1: transformers serve (both APIs, streaming, cancellation, native
tool calls, unknown model, its usage, a thinking model) and a small FastAPI app for a wrong key, a server failing
mid-reply and what a request carries (reasoning_effort, include_usage, chat_template_kwargs)."""
from __future__ import annotations

import threading
import time

import pytest

from conftest import CACHE, compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.llm.openai_lm import OpenAILM
from s2s.messages import Metric, ReplyText, Transcript, TurnEnd
from s2s.usage import METRICS, Usage
from tests.fixtures import llm_models, openai_servers, weather_tools

pytest.importorskip("openai")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def tool_lm():
    """A tiny Qwen2 chat LM overfitted to answer the capital question and to call get_weather (cached)."""
    return llm_models.tool_lm("native", CACHE / "models")


@pytest.fixture(scope="module")
def served(tool_lm, tmp_path_factory):
    with openai_servers.transformers_serve(tmp_path_factory.mktemp("serve")) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def faulty():
    with openai_servers.faulty_server() as root:
        yield root


def make(base_url: str, model: str, **options) -> OpenAILM:
    stage = OpenAILM(model=model, base_url=base_url, **{"system_prompt": None, "history_turns": 0,
                                                        "temperature": 0.0, "max_tokens": 40, **options})
    stage.setup()
    return stage


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_reply_streams_sentence_by_sentence(served, tool_lm, api):
    stage = make(served, str(tool_lm), api=api)
    try:
        out = list(stage.process(Transcript(weather_tools.CAPITAL, 2, "en")))
    finally:
        stage.close()
    assert isinstance(out[0], Metric) and out[0].name == "llm_first_token_s" and 0 < out[0].value < 10
    sentences = [m for m in out if isinstance(m, ReplyText)]  # released as they end, before the reply does
    assert len(sentences) >= 2 and all(m.turn == 2 and m.language == "en" for m in sentences)
    assert " ".join(m.text for m in sentences) == weather_tools.CAPITAL_REPLY
    assert out[-1] == TurnEnd(2)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_a_native_tool_call_runs_and_the_follow_up_is_spoken(served, tool_lm, api):
    weather_tools.CALLS.clear()
    stage = make(served, str(tool_lm), api=api, tools="tests.fixtures.weather_tools")
    try:
        out = list(stage.process(Transcript(weather_tools.QUESTION, 0, "en")))
    finally:
        stage.close()
    assert weather_tools.CALLS == [("get_weather", {"city": "Paris"})]
    [event] = [m for m in out if isinstance(m, Metric) and m.name == "tool_call"]
    assert event.extra == {"event": "tool_call", "tool": "get_weather", "arguments": {"city": "Paris"},
                           "result": weather_tools.RESULT, "error": False}
    spoken = " ".join(m.text for m in out if isinstance(m, ReplyText))
    assert spoken == weather_tools.FOLLOW_UP and "tool_call" not in spoken


def test_closing_the_reply_cancels_the_request(served, tool_lm):
    stage = make(served, str(tool_lm), max_tokens=2000)
    try:
        stream = stage.stream(stage.chat_messages("hello world"))  # an untrained prompt: rambles to the cap
        assert isinstance(next(stream), str)
        start = time.perf_counter()
        stream.close()  # what LLMStage.process does when the runner closes it
        assert time.perf_counter() - start < 1.0
        # the server notices the closed connection and stops generating: a new request is served at once
        start = time.perf_counter()
        out = list(stage.process(Transcript(weather_tools.CAPITAL, 1, "en")))
        assert time.perf_counter() - start < 10 and out[-1] == TurnEnd(1)
    finally:
        stage.close()


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_closing_the_reply_closes_the_servers_stream(faulty, api):
    stage = make(f"{faulty}/slow/v1", "m", api=api)
    try:
        replies = stage.process(Transcript("hi", 0, "en"))
        assert isinstance(next(replies), Metric)  # the first token arrived: the server is streaming
        openai_servers.STREAMS_ENDED.clear()
        closed = time.monotonic()
        replies.close()  # what the runner does on barge-in or shutdown
        deadline = closed + 5
        while not openai_servers.STREAMS_ENDED and time.monotonic() < deadline:
            time.sleep(0.02)
        assert openai_servers.STREAMS_ENDED and openai_servers.STREAMS_ENDED[0] - closed < 1.0
    finally:
        stage.close()


def test_an_unknown_model_fails_in_setup_naming_the_server(served):
    with pytest.raises(RuntimeError) as caught:
        make(served, "no-such/model")
    message = str(caught.value)
    assert "\n" not in message and served in message and "'no-such/model' is not served: HTTP 500" in message


def test_an_unreachable_server_fails_in_setup_in_one_line():
    url = f"http://127.0.0.1:{openai_servers.free_port()}/v1"
    with pytest.raises(RuntimeError) as caught:
        make(url, "m", timeout_s=2)
    message = str(caught.value)
    assert "\n" not in message and url in message and "no server answered" in message and "ConnectError" in message


def test_a_wrong_key_fails_in_setup_with_what_the_server_said(faulty):
    url = f"{faulty}/keyed/v1"
    with pytest.raises(RuntimeError) as caught:
        make(url, "m", api_key="sk-wrong")
    message = str(caught.value)
    assert "\n" not in message and url in message and "HTTP 401: Incorrect API key provided." in message
    make(url, "m", api_key=openai_servers.API_KEY).close()  # the right key passes


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
@pytest.mark.parametrize("mode", ["drop", "stall"])
def test_a_server_failing_mid_reply_ends_the_turn_with_an_error(faulty, mode, api, caplog):
    stage = make(f"{faulty}/{mode}/v1", "m", timeout_s=1.0, api=api)
    start = time.perf_counter()
    try:
        out = list(stage.process(Transcript("hi", 5, "en")))
    finally:
        stage.close()
    assert time.perf_counter() - start < 5  # no hang: a stall ends at timeout_s
    # what was said before the failure is kept (as a short first chunk and the rest of its sentence)
    assert " ".join(m.text for m in out if isinstance(m, ReplyText)) == "The first sentence is complete."
    [error] = [m for m in out if isinstance(m, Metric) and m.name == "llm_error"]
    assert "failed mid-reply" in error.extra["error"] and faulty in error.extra["error"]
    assert out[-1] == TurnEnd(5)
    assert any("the reply stopped" in r.message for r in caplog.records)
    assert not [t for t in threading.enumerate() if t.name.startswith("s2s-")]


@pytest.mark.parametrize("api,key", [("chat_completions", "reasoning_effort"), ("responses", "reasoning")])
@pytest.mark.parametrize("effort", [None, "minimal", "high"])
def test_reasoning_effort_reaches_the_server_in_each_apis_form(faulty, api, key, effort):
    stage = make(f"{faulty}/record/v1", "m", api=api, reasoning_effort=effort)
    openai_servers.RECEIVED.clear()
    try:
        out = list(stage.process(Transcript("Think about it.", 0, "en")))
    finally:
        stage.close()
    assert [m.text for m in out if isinstance(m, ReplyText)] == ["It is noted."]
    [body] = openai_servers.RECEIVED
    assert body["model"] == "m" and body["stream"] is True
    if effort is None:  # null sends nothing: a server or model without reasoning never sees the key
        assert "reasoning_effort" not in body and "reasoning" not in body
    else:
        assert body[key] == (effort if api == "chat_completions" else {"effort": effort})


@pytest.mark.parametrize("api,key", [("chat_completions", "max_tokens"), ("responses", "max_output_tokens")])
def test_a_turns_own_token_cap_is_sent_when_lower_than_the_stages(faulty, api, key):
    stage = make(f"{faulty}/record/v1", "m", api=api)  # max_tokens 40
    openai_servers.RECEIVED.clear()
    try:
        stage.context.plan_turn(0, max_tokens=5)  # a realtime client's max_output_tokens for one response
        stage.context.plan_turn(1, max_tokens=400)  # more than the stage allows: its own cap holds
        for turn in range(3):
            list(stage.process(Transcript("Think about it.", turn, "en")))
    finally:
        stage.close()
    assert [body[key] for body in openai_servers.RECEIVED] == [5, 40, 40]


@pytest.mark.parametrize("override,fragment", [
    ("llm.reasoning_effort=extreme", "llm.reasoning_effort=extreme: invalid; expected one of minimal, low, medium, "
                                     "high or null"),
    ("llm.api=completions", "llm.api=completions: invalid; expected one of chat_completions, responses"),
    ("llm.base_url=localhost:8000", "expected an http:// or https:// URL"),
    ("llm.tools=no_such_tools_module", "expected an importable Python module with TOOLS and call_tool"),
    ("llm.timeout_s=0", "llm.timeout_s=0: invalid"),
])
def test_validation_names_key_value_and_what_is_valid(override, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(["llm=openai", override], tmp_path))


def test_the_api_key_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    specs = validate(compose_config(["llm=openai"], tmp_path))
    assert next(s for s in specs if s.group == "llm").kwargs["api_key"] == "sk-from-env"
    monkeypatch.delenv("OPENAI_API_KEY")
    specs = validate(compose_config(["llm=openai"], tmp_path))
    assert next(s for s in specs if s.group == "llm").kwargs["api_key"] is None


@pytest.mark.slow
def test_a_sweep_over_local_and_api_llms_gives_one_row_each(served, tool_lm, espeak, tmp_path):
    """python run.py -m llm=transformers,openai: the same tiny model in-process and behind the server."""
    import csv

    from conftest import run_cli

    question = espeak("What is the capital of France?", tmp_path / "question.wav")
    sweep = tmp_path / "sweep"
    # keys only one backend has come from the environment (OPENAI_BASE_URL), so both jobs take every override
    result = run_cli("-m", "llm=transformers,openai", f"llm.model={tool_lm}", "llm.system_prompt=null",
                     f"source.path={question}", "sink=discard", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
                     env={"OPENAI_BASE_URL": served}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with (sweep / "summary.csv").open(newline="") as file:
        table = list(csv.DictReader(file))
    assert [(r["label"], r["status"], r["error"]) for r in table] == [
        ("llm=transformers", "completed", ""), ("llm=openai", "completed", "")]
    for row in table:
        assert float(row["llm_first_token_s"]) > 0 and float(row["voice_to_voice_s"]) > 0
    assert "| 1 | `llm=openai` | completed |" in (sweep / "summary.md").read_text()


def usage_of(out) -> Usage:
    counts = {field: int(m.value) for m in out if isinstance(m, Metric)
              for field, name in METRICS.items() if m.name == name}
    return Usage(**counts)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_the_servers_own_count_of_tokens_is_reported(served, tool_lm, api):
    from transformers import AutoTokenizer

    stage = make(served, str(tool_lm), api=api)
    try:
        out = list(stage.process(Transcript(weather_tools.CAPITAL, 0, "en")))
    finally:
        stage.close()
    tokenizer = AutoTokenizer.from_pretrained(tool_lm)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": weather_tools.CAPITAL}],
                                           add_generation_prompt=True, tokenize=True, return_dict=True)
    reply = tokenizer(weather_tools.CAPITAL_REPLY, add_special_tokens=False)["input_ids"]
    usage = usage_of(out)
    assert usage.input_tokens == len(prompt["input_ids"])
    assert usage.output_tokens == len(reply) + 1  # transformers serve counts the end token, as the local backends
    assert stage.context.usage == usage


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_the_usage_a_server_sends_is_passed_on_with_its_cached_tokens(faulty, api):
    stage = make(f"{faulty}/record/v1", "m", api=api)
    openai_servers.RECEIVED.clear()
    try:
        out = list(stage.process(Transcript("How much was that?", 0, "en")))
    finally:
        stage.close()
    counts = openai_servers.USAGE
    assert usage_of(out) == Usage(counts["input"], counts["output"], counts["cached"])
    [body] = openai_servers.RECEIVED
    if api == "chat_completions":  # OpenAI sends a stream's usage only when asked
        assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("thinking", [None, False, True])
def test_thinking_reaches_the_server_as_the_chat_templates_switch(faulty, thinking):
    stage = make(f"{faulty}/record/v1", "m", thinking=thinking)
    openai_servers.RECEIVED.clear()
    try:
        list(stage.process(Transcript("Think about it.", 0, "en")))
    finally:
        stage.close()
    [body] = openai_servers.RECEIVED
    if thinking is None:  # null sends nothing: servers without a chat template never see the key
        assert "chat_template_kwargs" not in body
    else:
        assert body["chat_template_kwargs"] == {"enable_thinking": thinking}


def test_a_served_thinking_model_answers_at_once_with_thinking_off_and_never_speaks_its_reasoning(served):
    model = str(llm_models.chat_lm("thinking", CACHE / "models"))
    replies = {}
    for thinking in (False, None):
        stage = make(served, model, thinking=thinking)
        try:
            out = list(stage.process(Transcript(weather_tools.CAPITAL, 0, "en")))
        finally:
            stage.close()
        replies[thinking] = " ".join(m.text for m in out if isinstance(m, ReplyText))
        assert "think" not in str(stage.context.history())
    assert replies == {False: llm_models.FAST_REPLY, None: llm_models.THOUGHTFUL_REPLY}


@pytest.mark.parametrize("overrides,fragment", [
    (["llm.thinking=false", "llm.reasoning_effort=low"], "llm.thinking=false: invalid; expected null while "
                                                         "reasoning_effort is set"),
    (["llm.thinking=true", "llm.base_url=https://api.openai.com/v1"], "llm.thinking=true: invalid; expected null "
                                                                      "for api.openai.com"),
    (["llm.thinking=false", "llm.base_url=http://127.0.0.1:8000/v1", "llm.api=responses"],
     "llm.thinking=false: invalid; expected null with api=responses"),
    (["llm.thinking=maybe"], "llm.thinking=maybe: invalid"),
])
def test_thinking_is_refused_where_no_chat_template_takes_it(overrides, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(["llm=openai", *overrides], tmp_path))
