"""llm=mlx_lm through mlx-lm's own generation code on mlx[cpu] (Linux) with the tiny tool-calling LM:
streaming sentences, token counts, tool calls, cancellation, and the platform rule (no MLX on Intel Macs)."""
from __future__ import annotations

import time

import pytest

from conftest import CACHE, compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.llm.mlx_lm import MLXLM
from s2s.messages import Metric, ReplyText, Transcript, TurnEnd
from tests.fixtures import llm_models, weather_tools

pytest.importorskip("mlx_lm")


def make(tools: str | None) -> MLXLM:
    stage = MLXLM(model=str(llm_models.tool_lm("native", CACHE / "models")), system_prompt=None, history_turns=0,
                  max_new_tokens=40, tools=tools)
    stage.setup()
    stage.warm_up()
    return stage


@pytest.fixture(scope="module")
def stage():
    stage = make("tests.fixtures.weather_tools")
    yield stage
    stage.close()


def test_reply_streams_sentence_by_sentence():
    stage = make(None)
    out = list(stage.process(Transcript(weather_tools.CAPITAL, 4, "en")))
    assert isinstance(out[0], Metric) and out[0].name == "llm_first_token_s"
    sentences = [m for m in out if isinstance(m, ReplyText)]
    assert len(sentences) >= 2 and all(m.turn == 4 and m.language == "en" for m in sentences)
    assert " ".join(m.text for m in sentences) == weather_tools.CAPITAL_REPLY
    assert out[-1] == TurnEnd(4)


def test_a_reply_reports_mlx_lms_own_token_counts():
    from transformers import AutoTokenizer

    stage = make(None)
    out = list(stage.process(Transcript(weather_tools.CAPITAL, 0, "en")))
    counts = {m.name: int(m.value) for m in out if isinstance(m, Metric) and m.name.endswith("_tokens")}
    tokenizer = AutoTokenizer.from_pretrained(llm_models.tool_lm("native", CACHE / "models"))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": weather_tools.CAPITAL}],
                                           add_generation_prompt=True, tokenize=True, return_dict=True)
    reply = tokenizer(weather_tools.CAPITAL_REPLY, add_special_tokens=False)["input_ids"]
    assert counts == {"llm_input_tokens": len(prompt["input_ids"]), "llm_output_tokens": len(reply) + 1}


def test_a_tool_call_runs_and_the_follow_up_is_spoken(stage):
    weather_tools.CALLS.clear()
    out = list(stage.process(Transcript(weather_tools.QUESTION, 0, "en")))
    assert weather_tools.CALLS == [("get_weather", {"city": "Paris"})]
    assert [m.extra["tool"] for m in out if isinstance(m, Metric) and m.name == "tool_call"] == ["get_weather"]
    assert " ".join(m.text for m in out if isinstance(m, ReplyText)) == weather_tools.FOLLOW_UP


def test_closing_the_reply_stops_generation(stage):
    stage.max_new_tokens = 1500
    try:
        pieces = stage.stream([{"role": "user", "content": "hello world"}])  # untrained: rambles to the cap
        assert isinstance(next(pieces), str)
        start = time.perf_counter()
        pieces.close()
        assert time.perf_counter() - start < 0.5
    finally:
        stage.max_new_tokens = 40


def test_mlx_is_refused_where_it_has_no_wheels_and_composes_elsewhere(tmp_path):
    with pytest.raises(ConfigErrors, match=r"llm=mlx_lm: invalid; expected another option on platform macos_intel "
                                           r"\(MLX publishes no wheels for Intel Macs\)"):
        validate(compose_config(["llm=mlx_lm", "platform=macos_intel"], tmp_path))
    for platform in ("macos", "linux"):
        validate(compose_config(["llm=mlx_lm", f"platform={platform}"], tmp_path))
    with pytest.raises(ConfigErrors, match="llm.model=./no/such/model: invalid; expected an existing local model"):
        validate(compose_config(["llm=mlx_lm", "llm.model=./no/such/model"], tmp_path))
