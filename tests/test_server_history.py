"""A session's history compaction and token usage through a real server, its LLM a real local HTTP server.

The server runs ``llm=openai`` against the recording endpoint of tests/fixtures/openai_servers.py (in this
process, on 127.0.0.1): every request it makes is kept, every reply is "It is noted." with a fixed usage. So the
summary request, the summary's place in the next prompt, each ``response.done``'s usage and the session's total
in ``GET /v1/sessions`` are all observable, with the real session, outbox and translator in between.
"""
from __future__ import annotations

import time

import pytest

from realtime_server import Events, RunningServer, openai_client
from s2s.compaction import INSTRUCTIONS, NOTE
from tests.fixtures import openai_servers

pytest.importorskip("websockets")
pytest.importorskip("openai")
pytest.importorskip("fastapi")

SYSTEM = "Be brief."
REPLY = "It is noted."


@pytest.fixture(scope="module")
def faulty():
    with openai_servers.faulty_server() as root:
        yield root


@pytest.fixture(scope="module")
def server(tmp_path_factory, faulty):
    running = RunningServer(tmp_path_factory.mktemp("server"), "llm=openai", f"llm.base_url={faulty}/record/v1",
                            "llm.model=m", "llm.api_key=null", "llm.compact_history=true", "llm.history_turns=1",
                            f"llm.system_prompt={SYSTEM}", "server.max_sessions=1", "server.log_transcripts=true",
                            "runner.warm_up=false", env={"S2S_API_KEY": ""})
    yield running
    assert running.stop() == 0, running.output[-3000:]


def session_of(server: RunningServer, session_id: str) -> dict:
    return next(s for s in server.get("/v1/sessions")[1]["sessions"] if s["id"] == session_id)


def test_a_session_summarises_what_passed_its_history_and_counts_every_token(server):
    openai_servers.RECEIVED.clear()
    with openai_client(server, "unused").realtime.connect(model="s2s") as connection:
        events = Events(connection)
        session_id = events.until("session.created", 60).session.id
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        events.until("session.updated", 30)

        def ask(text: str):
            connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": text}]})
            connection.response.create()
            return events.until("response.done", 60).response

        done = [ask("My name is Ada."), ask("I live in Paris.")]
        deadline = time.monotonic() + 30  # the summary is written after the second reply, in its own thread
        while session_of(server, session_id)["history_summary"] is None and time.monotonic() < deadline:
            time.sleep(0.1)
        done.append(ask("What is my name?"))
        counts = openai_servers.USAGE
        whole = 5 * (counts["input"] + counts["output"])  # three replies and two summaries (the session's end
        deadline = time.monotonic() + 30  # would stop the second: after the third reply, the second exchange goes)
        while session_of(server, session_id)["usage"]["total_tokens"] < whole and time.monotonic() < deadline:
            time.sleep(0.1)
    for response in done:
        assert response.status == "completed" and response.output[0].content[0].text == REPLY
        usage = response.usage
        assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
            counts["input"], counts["output"], counts["input"] + counts["output"])
        assert usage.input_token_details.cached_tokens == counts["cached"]
        assert usage.input_token_details.text_tokens == counts["input"]

    asked, told, summary_request, named, next_summary_request = openai_servers.RECEIVED
    assert summary_request["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
    conversation = summary_request["messages"][1]["content"]
    assert f"User: My name is Ada.\nAssistant: {REPLY}" in conversation and "Paris" not in conversation
    assert named["messages"] == [{"role": "system", "content": f"{SYSTEM}\n\n{NOTE}{REPLY}"},
                                 {"role": "user", "content": "I live in Paris."},
                                 {"role": "assistant", "content": REPLY},
                                 {"role": "user", "content": "What is my name?"}]
    assert [m["content"] for m in told["messages"]] == [SYSTEM, "My name is Ada.", REPLY, "I live in Paris."]
    folded = next_summary_request["messages"][1]["content"]  # the summary so far, and the exchange after it
    assert f"What was summarised before:\n{REPLY}" in folded and "User: I live in Paris." in folded
    assert "Ada" not in folded and "What is my name?" not in folded

    server.wait_idle()
    session = session_of(server, session_id)
    assert session["history_summary"] == REPLY
    assert [m["content"] for m in session["history"]] == ["What is my name?", REPLY]
    requests = 5  # three replies and two summaries
    assert session["usage"] == {"total_tokens": requests * (counts["input"] + counts["output"]),
                                "input_tokens": requests * counts["input"],
                                "output_tokens": requests * counts["output"],
                                "cached_tokens": requests * counts["cached"]}
