"""OpenTelemetry traces: a real run and a real server session send their span trees to an OTLP/HTTP receiver
started here on 127.0.0.1; a receiver that is gone costs the run nothing; a bad endpoint stops before loading."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import CONF_DIR, ROOT, compose_config, run_cli
from graph_stages import Collector, CountingSource, Recognizer, Speculator, Voice
from s2s import tracing
from s2s.config import validate
from s2s.graph import Graph
from s2s.llm.echo import EchoLM
from s2s.metrics import Recorder
from s2s.platform import PLATFORMS
from s2s.spans import TurnSpans

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
STAGES = ("vad", "stt", "llm", "tts")


class Receiver:
    """An OTLP/HTTP trace receiver: decodes each ``ExportTraceServiceRequest`` posted to /v1/traces."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.spans: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                receiver.take(request, self.path, dict(self.headers))
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, request: Any, path: str, headers: dict[str, str]) -> None:
        self.headers.append({key.lower(): value for key, value in headers.items()} | {"path": path})
        for resource_spans in request.resource_spans:
            resource = attributes_of(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append({"name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                       "parent": span.parent_span_id.hex() or None, "resource": resource,
                                       "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                                       "attributes": attributes_of(span.attributes),
                                       "events": [event.name for event in span.events], "status": span.status.code})

    def wait_for(self, name: str, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while not any(span["name"] == name for span in self.spans) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [span for span in self.spans if span["name"] == name]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes_of(pairs: Any) -> dict[str, Any]:
    def value(any_value: Any) -> Any:
        kind = any_value.WhichOneof("value")
        return getattr(any_value, kind) if kind else None

    return {pair.key: value(pair.value) for pair in pairs}


def closed_port() -> int:
    with socket.socket() as sock:  # bound, then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_tree(spans: list[dict[str, Any]], root_name: str, records: list[dict[str, Any]],
               stages: dict[str, str]) -> dict[str, Any]:
    """The spans of one root: root -> a turn per record -> a span per stage, each with the record's figures."""
    [root] = [span for span in spans if span["name"] == root_name]
    turns = {span["attributes"]["s2s.turn"]: span for span in spans if span["name"] == "turn"
             and span["parent"] == root["id"]}
    assert sorted(turns) == [record["turn"] for record in records] and records
    for record in records:
        turn = turns[record["turn"]]
        assert turn["trace"] == root["trace"] and root["start"] <= turn["start"] <= turn["end"] <= root["end"]
        for name, value in record["timings"].items():  # the figures of metrics.json, under the same names
            assert turn["attributes"].get(f"s2s.{name}") == value, name
        assert "first_audio_heard" in turn["events"]
        children = {span["name"]: span for span in spans if span["parent"] == turn["id"]}
        assert sorted(children) == sorted(STAGES), children
        for name, span in children.items():
            assert turn["start"] <= span["start"] <= span["end"] <= turn["end"], name
            assert span["attributes"]["s2s.backend"] == stages[name]
        assert children["stt"]["attributes"]["s2s.stt_s"] == record["timings"]["stt_s"]
        assert children["tts"]["attributes"]["s2s.tts_rtf"] == record["timings"]["tts_rtf"]
        assert children["vad"]["attributes"]["s2s.endpoint_s"] == record["timings"]["endpoint_s"]
        llm = children["llm"]["attributes"]
        assert llm["gen_ai.operation.name"] == "chat" and llm.get("gen_ai.request.model") == llm.get("s2s.model")
        assert llm["gen_ai.response.time_to_first_chunk"] == record["timings"]["llm_first_token_s"]
        assert llm.get("gen_ai.usage.input_tokens") == record["reported"].get("llm_input_tokens")  # none: echo
        assert llm.get("gen_ai.usage.output_tokens") == record["reported"].get("llm_output_tokens")
        assert children["stt"]["start"] <= children["llm"]["start"] <= children["tts"]["start"]
    return root


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF_DIR / "tracing").glob("*.yaml")))
@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_tracing_option_composes_and_binds_on_every_platform(option, platform):
    settings, errors = tracing.read_settings(compose_config([f"tracing={option}", f"platform={platform}"]))
    classes = {"none": tracing.NoTracing, "console": tracing.ConsoleTracing, "otlp": tracing.OtlpTracing}
    assert errors == [] and type(settings) is classes[option]


@pytest.mark.parametrize("endpoint", ["localhost:4318", "127.0.0.1", "ftp://127.0.0.1:4318", "http://:4318",
                                      "http://host:99999", "http://host:4318/v1/traces", "http://user:pw@host:4318",
                                      "http://host:4318?x=1", "http:///v1"])
def test_a_malformed_endpoint_is_one_error_naming_the_key(endpoint):
    _, errors = tracing.read_settings(compose_config(["tracing=otlp", f"tracing.endpoint='{endpoint}'"]))
    [error] = errors
    assert error.key == "tracing.endpoint" and "http(s)://host[:port]" in str(error)


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:4318", "https://collector.example.com",
                                      "http://[::1]:4318/", "https://otlp.example.com/otlp"])
def test_an_otlp_base_is_accepted(endpoint):
    settings, errors = tracing.read_settings(compose_config(["tracing=otlp", f"tracing.endpoint='{endpoint}'"]))
    assert errors == [] and settings.where() == endpoint.rstrip("/") + "/v1/traces"


def test_headers_and_keys_of_other_options_are_checked():
    cfg = compose_config(["tracing=otlp"])
    cfg.tracing.headers = {"bad name": "x", "ok": ""}  # a name the override grammar cannot even write
    _, errors = tracing.read_settings(cfg)
    assert sorted(error.key for error in errors) == ["tracing.headers.bad name", "tracing.headers.ok"]
    assert all("<hidden>" in str(error) for error in errors)  # a header may be a secret: never shown
    _, [error] = tracing.read_settings(compose_config(["+tracing.endpoint=http://127.0.0.1:4318"]))
    assert error.key == "tracing.endpoint" and "tracing=otlp" in error.expected


def test_a_malformed_endpoint_stops_the_run_before_anything_loads(tmp_path):
    result = run_cli("tracing=otlp", "tracing.endpoint=localhost:4318", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("config error: tracing.endpoint=localhost:4318: invalid; expected an OTLP/HTTP base")
    assert "set up" not in result.stdout + result.stderr  # no stage was built, no model loaded
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "config_error"


# ---------------------------------------------------------------------------------------------- the span tree
def traced_graph(script: list[str], tmp_path: Path, llm: Any = None) -> list[Any]:
    """The test graph with speculation (tests/graph_stages.py), traced into the SDK's in-memory exporter; its LLM
    echoes unless ``llm`` is given (a set-up stage)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    recorder = Recorder(tmp_path)
    recorder.listen(TurnSpans(provider.get_tracer("test"), "run", [], recorder, {}))
    graph = Graph([("source", CountingSource(turns=len(script), delay_s=0.15)), ("vad", Speculator(script)),
                   ("stt", Recognizer()), ("llm", llm or EchoLM()), ("tts", Voice()), ("sink", Collector())], recorder)
    graph.setup()
    result = graph.run()
    graph.close()
    recorder.finish(result.status)
    return list(memory.get_finished_spans())


def test_a_discarded_speculative_attempt_makes_no_span(tmp_path):
    spans = traced_graph(["speak", "spec", "speak", "discard", "spec", "speak", "confirm"], tmp_path)
    turns = [span for span in spans if span.name == "turn"]
    assert [span.attributes["s2s.turn"] for span in turns] == [1]  # attempt 0 was spoken over: no trace
    assert {span.attributes["s2s.turn"] for span in spans if span.name in STAGES} == {1}
    [root] = [span for span in spans if span.name == "run"]
    assert root.attributes["s2s.turns"] == 1 and turns[0].parent.span_id == root.context.span_id
    spans = traced_graph(["speak", "spec"], tmp_path / "unconfirmed")  # never confirmed: only the run's span
    assert [span.name for span in spans] == ["run"]


# ---------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    receiver = Receiver()
    out = tmp_path_factory.mktemp("traced")
    started = time.monotonic()
    result = run_cli("tracing=otlp", f"tracing.endpoint={receiver.url}", "+tracing.headers.authorization=Bearer t0k3n",
                     "tracing.service_name=s2s-test", f"hydra.run.dir={out}", cwd=out)
    seconds = time.monotonic() - started
    receiver.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    return receiver, out, seconds


@pytest.mark.slow
def test_a_run_sends_its_span_tree_with_the_figures_of_metrics_json(traced_run):
    receiver, out, _ = traced_run
    metrics = json.loads((out / "metrics.json").read_text())
    root = check_tree(receiver.spans, "run", metrics["turns"], metrics["stages"])
    assert root["attributes"]["s2s.status"] == "completed" and root["parent"] is None
    [llm] = [span["attributes"] for span in receiver.spans if span["name"] == "llm"]
    assert llm["gen_ai.request.model"] == "SmolLM2-135M-Instruct" and llm["gen_ai.provider.name"] == "onnx"
    assert root["attributes"]["s2s.median.voice_to_voice_s"] == metrics["summary"]["median"]["voice_to_voice_s"]
    assert {span["resource"]["service.name"] for span in receiver.spans} == {"s2s-test"}
    assert {span["trace"] for span in receiver.spans} == {root["trace"]}
    assert all(h["authorization"] == "Bearer t0k3n" and h["path"] == "/v1/traces" for h in receiver.headers)
    assert not any({"s2s.user", "s2s.assistant"} & set(span["attributes"]) for span in receiver.spans)  # text=false


@pytest.mark.slow
def test_a_backend_that_is_down_costs_the_run_nothing_and_is_said_once(traced_run, tmp_path):
    _, _, traced_s = traced_run
    started = time.monotonic()
    result = run_cli("tracing=otlp", f"tracing.endpoint=http://127.0.0.1:{closed_port()}",
                     f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"
    assert seconds <= traced_s + 3.0, (seconds, traced_s)
    output = result.stdout + result.stderr
    assert output.count("tracing: cannot export spans") == 1, output[-3000:]
    assert "Transient error" not in output and "Failed to export" not in output


@pytest.mark.slow
def test_console_tracing_prints_each_span_with_its_parent(tmp_path):
    result = run_cli("tracing=console", "tracing.text=true", "llm=echo", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    spans = {line.split()[1]: dict(part.split("=", 1) for part in line.split() if "=" in part)
             for line in result.stdout.splitlines() if line.startswith("span ")}
    assert set(spans) == {"run", "turn", *STAGES}
    assert spans["run"]["parent"] == "-" and spans["turn"]["parent"] == spans["run"]["span"]
    assert all(spans[stage]["parent"] == spans["turn"]["span"] for stage in STAGES)
    assert "s2s.user" in spans["turn"]  # tracing.text=true: the words too


@pytest.mark.slow
def test_a_server_session_is_traced_as_a_session_span(tmp_path):
    pytest.importorskip("websockets")
    pytest.importorskip("openai")
    from realtime_server import Events, RunningServer, openai_client, pcm16, send_speech

    receiver = Receiver()
    server = RunningServer(tmp_path, "llm=echo", "server.max_sessions=1", "runner.warm_up=false", "tracing=otlp",
                           f"tracing.endpoint={receiver.url}", env={"S2S_API_KEY": ""})
    try:
        with openai_client(server, "unused").realtime.connect(model="s2s") as connection:
            events = Events(connection)
            session_id = events.until("session.created", 60).session.id
            send_speech(connection, pcm16(ROOT / "s2s" / "samples" / "question.wav"))
            events.until("response.done", 300)
        server.wait_idle()
        [session] = [s for s in server.get("/v1/sessions", api_key=None)[1]["sessions"] if s["id"] == session_id]
        assert receiver.wait_for("session"), receiver.spans
    finally:
        assert server.stop() == 0, server.output[-3000:]
        receiver.stop()
    specs = {spec.group: spec.target for spec in validate(compose_config(["llm=echo"]))}
    root = check_tree(receiver.spans, "session", session["turns"], specs)
    assert root["attributes"]["session.id"] == session_id and root["attributes"]["s2s.status"] == "closed"
    [llm] = [span for span in receiver.spans if span["name"] == "llm"]
    assert llm["attributes"]["gen_ai.conversation.id"] == session_id
