"""``llm.thinking``: a thinking model's ``enable_thinking`` reaches its chat template, and reasoning is never spoken.

The tiny ``thinking`` LM (tests/fixtures/llm_models.py) has a Qwen3-style template: with the switch off the
template opens the reply with an empty reasoning block and the model answers at once; otherwise it reasons in
``<think>`` first. llm=openai's form of the switch is tested in test_llm_openai.py.
"""
from __future__ import annotations

import pytest

from conftest import CACHE, compose_config
from s2s.config import validate
from s2s.config_errors import ConfigError, ConfigErrors
from s2s.llm.echo import EchoLM
from s2s.messages import Metric, ReplyText, Transcript
from s2s.text import TagFilter
from tests.fixtures import llm_models, weather_tools

MODELS = CACHE / "models"


def stage_of(backend: str, thinking, model=None):
    model = str(model or llm_models.chat_lm("thinking", MODELS))
    options = {"system_prompt": None, "history_turns": 2, "max_new_tokens": 40, "thinking": thinking}
    if backend == "ctranslate2":
        from s2s.llm.ctranslate2_lm import CTranslate2LM

        stage = CTranslate2LM(model=model, device="cpu", compute_type="float32", cache_dir=str(MODELS),
                              unsure_below=None, **options)
    elif backend == "transformers":
        from s2s.llm.transformers_lm import TransformersLM

        stage = TransformersLM(model=model, device="cpu", unsure_below=None, **options)
    else:
        pytest.importorskip("mlx_lm")
        from s2s.llm.mlx_lm import MLXLM

        stage = MLXLM(model=model, **options)
    stage.threads = 1
    stage.setup()
    return stage


@pytest.mark.parametrize("backend", ["ctranslate2", "transformers", "mlx_lm"])
def test_thinking_off_answers_at_once_and_reasoning_is_never_spoken_nor_kept(backend):
    replies = {}
    for thinking in (False, None, True):
        stage = stage_of(backend, thinking)
        try:
            out = list(stage.process(Transcript(weather_tools.CAPITAL, 0)))
        finally:
            stage.close()
        replies[thinking] = " ".join(m.text for m in out if isinstance(m, ReplyText))
        assert stage.context.history()[-1] == {"role": "assistant", "content": replies[thinking]}
        assert any(isinstance(m, Metric) and m.name == "llm_first_token_s" for m in out)
    # the template's switch: false gives the empty reasoning block; true leaves the model to reason, and so does
    # null, which passes nothing, except under mlx-lm: it passes its own default, on only for a vocabulary with
    # <think> tokens (Qwen3's; not this tiny model's)
    default = llm_models.FAST_REPLY if backend == "mlx_lm" else llm_models.THOUGHTFUL_REPLY
    assert replies == {False: llm_models.FAST_REPLY, None: default, True: llm_models.THOUGHTFUL_REPLY}


def test_reasoning_split_across_pieces_and_rounds_stays_out_of_the_reply():
    filtered = TagFilter("<think>", "</think>")
    pieces = ["Well", " <th", "ink>plan", " it</thi", "nk> it is", " 3 < 5", " <think>unfinished"]
    spoken = "".join(text for piece in pieces for text in filtered.feed(piece)) + "".join(filtered.finish())
    assert spoken == "Well  it is 3 < 5 " and filtered.blocks == ["plan it", "unfinished"]

    class Thinker(EchoLM):
        def stream(self, messages):
            yield from ("<think>", "The user", " said hi.", "</think>", "Hello there.")

    out = list(Thinker().process(Transcript("hi", 0)))
    assert [m.text for m in out if isinstance(m, ReplyText)] == ["Hello there."]


@pytest.mark.parametrize("option", ["ctranslate2", "transformers"])
@pytest.mark.parametrize("model,fragment", [
    ("SmolLM2-135M-Instruct", "llm.thinking=false: invalid; expected null (the model's chat template has no "
                              "enable_thinking switch"),
    ("native", "llm.thinking=false: invalid; expected null (the model's chat template has no enable_thinking"),
])
def test_a_model_whose_template_has_no_switch_is_refused_before_loading(option, model, fragment, tmp_path):
    if model == "native":
        model = str(llm_models.tool_lm("native", MODELS))
    with pytest.raises(ConfigErrors, match=fragment.replace("(", r"\(")):
        validate(compose_config([f"llm={option}", f"llm.model={model}", "llm.thinking=false"], tmp_path))
    switchable = str(llm_models.chat_lm("thinking", MODELS))
    validate(compose_config([f"llm={option}", f"llm.model={switchable}", "llm.thinking=false"], tmp_path))


@pytest.mark.parametrize("backend", ["transformers", "mlx_lm"])
def test_the_switch_is_checked_again_when_the_model_loads(backend):
    """A hub id's template can be read only when it loads: setup checks it (here a folder validation never saw)."""
    with pytest.raises(ConfigError, match="llm.thinking=true: invalid; expected null"):
        stage_of(backend, True, llm_models.tool_lm("native", MODELS))


@pytest.mark.parametrize("option", ["ctranslate2", "mlx_lm", "openai", "transformers"])
def test_every_chat_backend_takes_the_switch_and_leaves_it_to_the_model_by_default(option, tmp_path):
    [spec] = [spec for spec in validate(compose_config([f"llm={option}", "platform=macos"], tmp_path))
              if spec.group == "llm"]
    assert spec.kwargs["thinking"] is None and spec.build().template_switches() == {}
