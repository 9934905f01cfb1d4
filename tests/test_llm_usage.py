"""Token usage as each local backend truly counts it (the rendered prompt in, every generated token out), added up
per turn by the Recorder and put on the LLM span as OpenTelemetry's ``gen_ai.usage.*``.

The tiny tool-calling LM answers the capital question with a known reply, so the counts are checked against
transformers' own tokenizer and chat template, not against the code under test. llm=openai's usage (the
server's) is tested in test_llm_openai.py, mlx-lm's in test_llm_mlx.py, the server's events in
test_server_items.py and test_server_tools.py.
"""
from __future__ import annotations

import pytest

from conftest import CACHE
from s2s.messages import Metric, ReplyText, Transcript
from s2s.metrics import Recorder
from s2s.usage import METRICS, Usage
from tests.fixtures import llm_models, weather_tools

MODELS = CACHE / "models"
SYSTEM = "Be brief."


@pytest.fixture(scope="module")
def native():
    return llm_models.tool_lm("native", MODELS)


@pytest.fixture(scope="module")
def tokenizer(native):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(native)


def stage_of(backend: str, model, set_up: bool = True, **options):
    options = {"history_turns": 2, "max_new_tokens": 48, "unsure_below": None, "system_prompt": None, **options}
    if backend == "ctranslate2":
        from s2s.llm.ctranslate2_lm import CTranslate2LM

        stage = CTranslate2LM(model=str(model), device="cpu", compute_type="float32", cache_dir=str(MODELS),
                              **options)
    else:
        from s2s.llm.transformers_lm import TransformersLM

        stage = TransformersLM(model=str(model), device="cpu", **options)
    stage.threads = 1
    if set_up:
        stage.setup()
    return stage


def usage_of(out) -> Usage:
    counts = {field: int(m.value) for m in out if isinstance(m, Metric)
              for field, name in METRICS.items() if m.name == name}
    return Usage(**counts)


@pytest.mark.parametrize("backend", ["ctranslate2", "transformers"])
def test_a_reply_reports_its_prompt_and_generated_tokens(backend, native, tokenizer):
    stage = stage_of(backend, native)
    try:
        out = list(stage.process(Transcript(weather_tools.CAPITAL, 0)))
    finally:
        stage.close()
    assert " ".join(m.text for m in out if isinstance(m, ReplyText)) == weather_tools.CAPITAL_REPLY
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": weather_tools.CAPITAL}],
                                           add_generation_prompt=True, tokenize=True, return_dict=True)
    reply = tokenizer(weather_tools.CAPITAL_REPLY, add_special_tokens=False)["input_ids"]
    usage = usage_of(out)
    assert usage.input_tokens == len(prompt["input_ids"])
    assert usage.output_tokens == len(reply) + 1  # the end-of-turn token is generated too
    assert stage.context.usage == usage  # the conversation's total


def test_ctranslate2_counts_its_static_system_prompt_as_cached_from_the_second_turn(native, tokenizer):
    stage = stage_of("ctranslate2", native, system_prompt=SYSTEM)
    try:
        first = usage_of(stage.process(Transcript("hello world", 0)))
        second = usage_of(stage.process(Transcript("how are you today?", 1)))
    finally:
        stage.close()
    system = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=True,
                                           return_dict=True)["input_ids"]
    assert first.cached_tokens == 0 and second.cached_tokens == len(system)
    assert second.input_tokens > first.input_tokens > len(system)  # the history is in the second prompt


def test_a_turns_tool_rounds_add_up_in_its_record():
    stage = stage_of("ctranslate2", llm_models.tool_lm("native", MODELS), tools="tests.fixtures.weather_tools")
    try:
        out = list(stage.process(Transcript(weather_tools.QUESTION, 0)))
    finally:
        stage.close()
    rounds = [int(m.value) for m in out if isinstance(m, Metric) and m.name == "llm_input_tokens"]
    assert len(rounds) == 2 and rounds[1] > rounds[0]  # the call and its result are in the second prompt
    recorder = Recorder(CACHE / "usage-recorder", content=False)
    for metric in out:
        if isinstance(metric, Metric):
            recorder.on_metric("llm", metric)
    reported = recorder.turns[0].reported
    outputs = [int(m.value) for m in out if isinstance(m, Metric) and m.name == "llm_output_tokens"]
    assert reported["llm_input_tokens"] == sum(rounds) and reported["llm_output_tokens"] == sum(outputs)


def test_the_llm_span_carries_the_turns_token_usage(native, tmp_path):
    pytest.importorskip("opentelemetry.sdk")
    from test_tracing import traced_graph

    stage = stage_of("ctranslate2", native, set_up=False, max_new_tokens=8)  # the graph sets it up
    spans = traced_graph(["speak", "spec", "speak", "confirm"] * 2, tmp_path, llm=stage)  # two turns
    llm = [span for span in spans if span.name == "llm"]
    assert len(llm) == 2
    for span in llm:
        turn = [t for t in spans if t.name == "turn" and t.context.span_id == span.parent.span_id][0]
        assert span.attributes["gen_ai.usage.input_tokens"] == turn.attributes["s2s.llm_input_tokens"] > 0
        assert span.attributes["gen_ai.usage.output_tokens"] == turn.attributes["s2s.llm_output_tokens"] > 0
        assert span.attributes["gen_ai.usage.cache_read.input_tokens"] == 0  # CTranslate2 says: no system prompt
