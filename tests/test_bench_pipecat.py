"""The pipecat comparison's own parts that need no pipecat: the chat-completions endpoint pipecat's OpenAILLMService
is pointed at (answered by the ``openai`` client, as pipecat's service uses it), and the one measure of both sides."""
from __future__ import annotations

import pytest

from s2s.bench.chat_server import ChatServer
from s2s.bench.pipecat_side import measured
from s2s.llm.ctranslate2_lm import CTranslate2LM
from s2s.llm.echo import EchoLM


MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]


def test_the_endpoint_streams_a_stage_reply_as_openai_chunks_on_loopback():
    """Our echo stage behind it: what comes back is the user's text, as sent (its content parts joined)."""
    openai = pytest.importorskip("openai")
    with ChatServer(EchoLM()) as server:
        assert server.url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=server.url, api_key="local", max_retries=0, timeout=10)
        chunks = list(client.chat.completions.create(model="s2s-local", messages=MESSAGES, stream=True,
                                                     stream_options={"include_usage": True}, temperature=0.7))
        assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == \
            "What is the capital of France?"
        assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
        assert chunks[-1].usage is not None and not chunks[-1].choices
        whole = client.chat.completions.create(model="s2s-local", messages=MESSAGES)
        assert whole.choices[0].message.content == "What is the capital of France?"
        assert [model.id for model in client.models.list()] == ["s2s-local"]
        assert server.wait_idle(1.0) and server.requests == 2


def test_a_reply_the_cap_cut_finishes_with_length_and_counts_its_tokens():
    """The packaged SmolLM2 with a four-token cap: the stream says ``length`` and the usage counts them."""
    openai = pytest.importorskip("openai")
    stage = CTranslate2LM(max_new_tokens=4)
    stage.setup()
    try:
        with ChatServer(stage) as server:
            client = openai.OpenAI(base_url=server.url, api_key="local", max_retries=0, timeout=60)
            chunks = list(client.chat.completions.create(
                model="m", stream=True, stream_options={"include_usage": True},
                messages=[{"role": "user", "content": "Tell me a long story about a dog and a cat."}]))
    finally:
        stage.close()
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 4 and chunks[-1].usage.prompt_tokens > 10
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices).strip()


def test_voice_to_voice_is_the_first_reply_after_the_end_of_speech_and_earlier_ones_are_cut_offs():
    assert measured([3.9, 2.1], 3.0) == (0.9, [-0.9])
    assert measured([3.0], 3.0) == (0.0, [])
    assert measured([1.5], 3.0) == (None, [-1.5])  # it replied during a pause and never again
    assert measured([], 3.0) == (None, [])
