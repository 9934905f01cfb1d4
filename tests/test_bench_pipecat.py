"""The pipecat comparison's own parts that need no pipecat: the chat-completions endpoint pipecat's OpenAILLMService
is pointed at (answered by the ``openai`` client, as pipecat's service uses it), and the one measure of both sides."""
from __future__ import annotations

import pytest

from s2s.bench.chat_server import ChatServer
from s2s.bench.pipecat_side import measured
from s2s.llm.calibration import Capped
from s2s.usage import Usage


class Stage:
    """Stands for a set-up LLM stage: ``stream(messages)`` yields text, then what our stages yield beside it."""

    def __init__(self, capped: bool = False) -> None:
        self.seen: list[list[dict[str, str]]] = []
        self.capped = capped
        self.closed = 0

    def stream(self, messages):
        self.seen.append(messages)
        try:
            yield "Paris is "
            yield "the capital."
            if self.capped:
                yield Capped()
            yield Usage(12, 5, 0)
        finally:
            self.closed += 1


MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": " What is the capital of France? "}]}]


def test_the_endpoint_streams_a_stage_reply_as_openai_chunks_on_loopback():
    openai = pytest.importorskip("openai")
    stage = Stage()
    with ChatServer(stage) as server:
        assert server.url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=server.url, api_key="local", max_retries=0, timeout=10)
        chunks = list(client.chat.completions.create(model="s2s-local", messages=MESSAGES, stream=True,
                                                     stream_options={"include_usage": True}, temperature=0.7))
        assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == \
            "Paris is the capital."
        assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (12, 5)
        whole = client.chat.completions.create(model="s2s-local", messages=MESSAGES)
        assert whole.choices[0].message.content == "Paris is the capital."
        assert [model.id for model in client.models.list()] == ["s2s-local"]
        assert server.wait_idle(1.0) and server.requests == 2
    # the messages as sent (content parts joined, nothing stripped); the stage's own settings decide the rest
    assert stage.seen[0] == [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": " What is the capital of France? "}]
    assert stage.closed == 2


def test_a_reply_the_cap_cut_finishes_with_length():
    openai = pytest.importorskip("openai")
    with ChatServer(Stage(capped=True)) as server:
        client = openai.OpenAI(base_url=server.url, api_key="local", max_retries=0, timeout=10)
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"


def test_voice_to_voice_is_the_first_reply_after_the_end_of_speech_and_earlier_ones_are_cut_offs():
    assert measured([3.9, 2.1], 3.0) == (0.9, [-0.9])
    assert measured([3.0], 3.0) == (0.0, [])
    assert measured([1.5], 3.0) == (None, [-1.5])  # it replied during a pause and never again
    assert measured([], 3.0) == (None, [])
