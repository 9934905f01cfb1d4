"""``server.engine=ray``: a local Ray instance, 2 Ray Serve replicas of 1 pipeline each, behind one endpoint.

One real server for the module (``llm=echo``, the smallest pipeline of the server tests), driven through the
official openai SDK: sessions routed to replicas with a free pipeline, the third refused as a local server
refuses it, a replica's actor killed with ``ray.kill`` mid-reply and replaced by Ray Serve, the front's
actor killed and restarted on its port. The bad inputs
(``server.replicas=0``, ``RAY_ADDRESS``) are each one line and exit 2, without waiting for anything.
"""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import pytest

from conftest import run_cli
from realtime_server import API_KEY, Events, RunningServer, openai_client, pcm16, reply_audio, send_speech

pytest.importorskip("ray.serve")
pytest.importorskip("websockets")
pytest.importorskip("openai")
pytestmark = pytest.mark.slow

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "S2S_API_KEY": API_KEY, "RAY_ADDRESS": ""}
GCS = re.compile(r"ray: started a local Ray instance \(GCS (\S+), node")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("ray-server"), "llm=echo", "server.engine=ray",
                            "server.replicas=2", "server.max_sessions=1", env=RAY_ENV)
    yield running
    assert running.stop() == 0, running.output[-3000:]
    gcs = GCS.search(running.output)
    assert gcs and not _reachable(gcs.group(1)), "the local Ray instance outlived its server"


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except OSError:
        return False


def connect(server):
    return openai_client(server, API_KEY).realtime.connect(model="s2s-test")


def replica_of(server, session_id: str) -> str:
    _, document = server.get("/v1/sessions")
    return next(s["replica"] for s in document["sessions"] if s["id"] == session_id)


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.25)


def test_the_front_keeps_the_handshake_rules_and_reads_out_every_replica(server):
    assert server.get("/health", api_key=None) == (200, {"status": "ok", "engine": "ray",
                                                         "replicas": {"ready": 2, "wanted": 2}})
    assert server.get("/v1/sessions", api_key="wrong-key-000000000")[0] == 401
    status, document = server.get("/v1/sessions")
    assert status == 200 and document["max_sessions"] == 2
    assert len({replica["replica"] for replica in document["replicas"] if replica["ready"]}) == 2
    with urllib.request.urlopen(server.http + "/", timeout=10) as page:
        assert page.status == 200 and b"<html" in page.read().lower()
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect

    with pytest.raises(InvalidStatus) as refused:
        with ws_connect(server.url, origin="http://evil.example", open_timeout=10,
                        additional_headers={"Authorization": f"Bearer {API_KEY}"}):
            pass
    assert refused.value.response.status_code == 403
    with ws_connect(server.url, open_timeout=10, additional_headers={"Authorization": f"Bearer {API_KEY}"},
                    max_size=None) as relayed:  # the replica's own limits, through the front
        assert json.loads(relayed.recv(timeout=30))["type"] == "session.created"
        relayed.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (1 << 21)}))
        assert json.loads(relayed.recv(timeout=30))["error"]["code"] == "frame_too_large"
        relayed.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Hi."}}))
        assert json.loads(relayed.recv(timeout=30))["type"] == "session.updated"
    server.wait_idle()


def test_two_sessions_get_their_replies_on_two_replicas_and_a_third_is_refused(server, espeak, tmp_path):
    questions = [espeak("What is the capital of France?", tmp_path / "a.wav"),
                 espeak("Tell me about the sun.", tmp_path / "b.wav")]
    with connect(server) as first, connect(server) as second:
        held = [Events(first), Events(second)]
        ids = [events.until("session.created", 60).session.id for events in held]
        with connect(server) as third:
            refused = Events(third)
            error = refused.until("error", 30)
            assert error.error.code == "session_limit_reached" and "server.replicas" in error.error.message
            assert refused.closed.wait(10), "the refused connection was closed"
        assert {replica_of(server, session_id) for session_id in ids} == set(
            r["replica"] for r in server.get("/v1/sessions")[1]["replicas"])  # one session on each replica
        for connection, question in zip((first, second), questions):
            send_speech(connection, pcm16(question))
        for events in held:
            done = events.until("response.done", 120)
            assert done.response.status == "completed"
            assert len(reply_audio(events.all, done.response.id)) > 24000 * 0.3
        heard = [events.of("conversation.item.input_audio_transcription.completed")[0].transcript.lower()
                 for events in held]
        keys = [{"what", "capital", "france"}, {"tell", "about", "sun"}]  # each session heard its own question
        found = [[len(words & set(re.findall(r"[a-z]+", text))) for words in keys] for text in heard]
        assert found[0][0] >= 2 and found[1][1] >= 2 and found[0][0] > found[0][1] and found[1][1] > found[1][0], heard
    server.wait_idle()
    assert server.get("/v1/sessions")[1]["refused"] >= 1


def test_a_killed_replica_ends_its_session_and_is_replaced_while_the_other_goes_on(server, espeak, tmp_path):
    import ray

    question = pcm16(espeak("Tell me about the sun and the moon and the stars.", tmp_path / "q.wav"))
    with connect(server) as doomed_connection, connect(server) as other_connection:
        doomed, other = Events(doomed_connection), Events(other_connection)
        doomed_id = doomed.until("session.created", 60).session.id
        other.until("session.created", 60)
        _, document = server.get("/v1/sessions")
        victim = next(r for r in document["replicas"] if r["replica"] == replica_of(server, doomed_id))
        before = {replica["replica"] for replica in document["replicas"]}
        send_speech(other_connection, question)
        other.until("response.created", 120)
        ray.init(address=GCS.search(server.output).group(1), log_to_driver=False)
        try:
            ray.kill(ray.get_actor(victim["actor"], namespace="serve"), no_restart=True)
        finally:
            ray.shutdown()
        error = doomed.until("error", 30)
        assert error.error.code == "server_error" and victim["replica"] in error.error.message
        assert doomed.closed.wait(10), "the killed replica's session was closed"
        done = other.until("response.done", 120)
        assert done.response.status == "completed" and len(reply_audio(other.all, done.response.id)) > 24000 * 0.3

        def replaced() -> bool:
            ready = {r["replica"] for r in server.get("/v1/sessions")[1]["replicas"] if r["ready"]}
            return len(ready) == 2 and bool(ready - before)

        wait_for(replaced, 180, "Ray Serve replaces the killed replica and it reports ready")
        with connect(server) as new_connection:  # the other replica is still held: this one must take it
            new = Events(new_connection)
            new_id = new.until("session.created", 60).session.id
            assert replica_of(server, new_id) not in before
            send_speech(new_connection, question)
            assert new.until("response.done", 120).response.status == "completed"
    _, document = server.get("/v1/sessions")
    assert {"id": doomed_id, "replica": victim["replica"], "status": "replica_failed"} in document["sessions"]
    server.wait_idle()  # both replicas held a session: the next test's would be refused until they are freed


def test_a_killed_front_is_restarted_on_its_port_and_new_sessions_get_replies(server, espeak, tmp_path):
    """A front killed outright can tell its clients nothing (a stopping one does: tests/test_server_front.py);
    Ray Serve starts a new one, which listens on the same port and learns the replicas from their heartbeats."""
    import ray

    question = pcm16(espeak("What is the capital of France?", tmp_path / "q.wav"))
    with connect(server) as doomed_connection:
        doomed = Events(doomed_connection)
        doomed.until("session.created", 60)
        ray.init(address=GCS.search(server.output).group(1), log_to_driver=False)
        try:
            fronts = [actor for actor in ray.util.list_named_actors(all_namespaces=True)
                      if actor["namespace"] == "serve" and "#Front#" in actor["name"]]
            assert len(fronts) == 1, fronts
            ray.kill(ray.get_actor(fronts[0]["name"], namespace="serve"), no_restart=True)
        finally:
            ray.shutdown()
        assert doomed.closed.wait(30), "the killed front's connection was dropped"

    def serving() -> bool:
        try:
            status, health = server.get("/health", api_key=None)
        except OSError:  # nothing listens yet
            return False
        return status == 200 and health["replicas"] == {"ready": 2, "wanted": 2}

    wait_for(serving, 120, "Ray Serve restarts the front on its port and it sees both replicas")
    with connect(server) as new_connection:
        new = Events(new_connection)
        new.until("session.created", 60)
        send_speech(new_connection, question)
        done = new.until("response.done", 120)
        assert done.response.status == "completed" and len(reply_audio(new.all, done.response.id)) > 24000 * 0.3
    server.wait_idle()

def test_dry_run_prints_the_deployment_and_the_graph(tmp_path):
    result = run_cli("server=realtime", "server.engine=ray", "server.replicas=3", "server.max_sessions=2",
                     "llm=echo", "dry_run=true", cwd=tmp_path, env=RAY_ENV)
    lines = result.stdout.splitlines()
    assert "engine=ray" in lines[0] and "local Ray instance" in lines[1]
    assert re.search(r"replica +x3, each 1 CPU, 0 GPU, max_sessions=2: 6 sessions in all", result.stdout)
    assert re.search(r"^  llm +s2s\.llm\.echo\.EchoLM", result.stdout, re.M)


@pytest.mark.parametrize("override,env,expected", [
    ("server.replicas=0", {}, "config error: server.replicas=0: invalid; expected a number from 1 to 64"),
    ("server.replicas=2", {}, "config error: server.replicas=2: invalid; expected 1 with server.engine=local"),
    ("server.engine=ray", {"RAY_ADDRESS": "not an address"},
     "config error: RAY_ADDRESS=not an address: invalid; expected auto (the cluster running on this machine) or "
     "HOST:PORT"),
    ("server.engine=ray", {"RAY_ADDRESS": "127.0.0.1:{closed}"},
     "config error: RAY_ADDRESS=127.0.0.1:{closed}: invalid; expected a Ray cluster that can be reached"),
    ("server.engine=ray", {"RAY_ADDRESS": "127.0.0.1:{silent}"},  # it accepts, and never answers as Ray would
     "config error: RAY_ADDRESS=127.0.0.1:{silent}: invalid; expected a Ray cluster that answers within 15 s"),
])
def test_bad_input_is_one_line_and_exit_2_without_waiting(override, env, expected, tmp_path):
    with socket.socket() as closed_socket, socket.socket() as silent:
        closed_socket.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        ports = {"closed": closed_socket.getsockname()[1], "silent": silent.getsockname()[1]}
        started = time.monotonic()
        result = run_cli("server=realtime", "llm=echo", override, f"hydra.run.dir={tmp_path}", timeout=120,
                         env={**RAY_ENV, **{key: value.format(**ports) for key, value in env.items()}})
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(expected.format(**ports)), lines[0]
    assert time.monotonic() - started < 45


def test_a_replica_that_cannot_set_up_its_pipelines_fails_the_start_with_the_stage_error(tmp_path):
    """Whisper medium.en is not in the offline cache: each replica's STT setup fails, and the driver says so."""
    result = run_cli("server=realtime", "llm=echo", "server.port=0", "server.engine=ray", "server.replicas=2",
                     "server.max_sessions=1", "stt.model=medium.en", f"hydra.run.dir={tmp_path}", env=RAY_ENV,
                     timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    # Ray's log thread prints its lines in two writes (the text, then the newline): ours may land between them,
    # so the driver's one error line is looked for anywhere in a line (seen on a loaded 2-core box)
    errors = re.findall(r"(?<![A-Za-z])error: [^\n]*", result.stderr)
    assert errors == [line for line in errors if "a replica could not set up its pipelines: stage 'stt' could not "
                      "start" in line] and len(errors) == 1, result.stderr[-3000:]
    assert "listening on" not in result.stdout


def test_a_cluster_without_a_driver_gets_the_application_from_serves_builder(tmp_path):
    """``serve run`` / ``serve deploy`` / a RayService import s2s.server.ray_service:app; it checks as run.py does."""
    from ray.serve import Application

    from s2s.server.ray_service import app

    built = app({"overrides": "llm=echo server.replicas=3 server.host=0.0.0.0", "output_dir": str(tmp_path)})
    assert isinstance(built, Application)
    with pytest.raises(ValueError, match=r"^config error: server\.replicas=0: invalid; expected a number from 1"):
        app({"overrides": ["llm=echo", "server.replicas=0"], "output_dir": str(tmp_path)})
