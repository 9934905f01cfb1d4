"""The server's settings and limits, declared once: the ``server`` config group binds to this signature.

conf/server/realtime.yaml gives the values; the annotations below are the only statement of what each may
be, and the config validator (:func:`s2s.schema.check_kwargs`) reads them, as it reads a stage's constructor.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Annotated, Any

from omegaconf import DictConfig

from s2s.config import node_kwargs
from s2s.config_errors import RATE, ConfigError, ConfigErrors, OneOf, Range, ValidationContext
from s2s.settings_node import bind


@dataclass(frozen=True)
class ServerSettings:
    """Where the server listens, who may connect, and what a client may send.

    Args:
        host: bind address (127.0.0.1 keeps it on this machine).
        port: TCP port; 0 takes any free one.
        max_sessions: concurrent sessions, each holding one pooled pipeline.
        api_key: when set (8+ characters), connections must send ``Authorization: Bearer <key>``.
        max_frame_bytes: a client frame above this gets an error event.
        min_rate: lowest PCM16 rate a client may name in ``session.update``.
        max_rate: highest such rate.
        max_instructions_chars: longest ``session.update`` instructions accepted.
        idle_timeout_s: a session without a client event for this long is closed.
        max_queued_events: events waiting for a client that does not read them; one more closes its session
            (an ``error``, close code 1008), so a silent client cannot grow the server's memory.
        partial_transcripts_s: while the user speaks, the utterance so far is transcribed again after each this
            many seconds of new speech (more as it grows or as passes cost more: progressive, ``s2s.server.partials``),
            and what it adds goes out as ``input_audio_transcription.delta``; null: one delta with the whole
            transcript, just before ``.completed``.
        log_transcripts: the users' and the assistant's words go to the log, each session's transcript.jsonl
            and metrics.json, and ``GET /v1/sessions``; off (the default), only the figures do.
        visemes: every session starts with ``audio.output.visemes`` on: its replies carry timed mouth shapes
            (``speech_to_speech.output_audio.visemes``, as the reference system sends them); a client may
            turn them on or off for its session. Off (the default): only a client that asks gets them.
        engine: ``local`` (this process holds every pipeline) or ``ray`` (Ray Serve replicas, each holding
            ``max_sessions`` pipelines, behind one endpoint; ``RAY_ADDRESS`` joins a cluster).
        replicas: with ``engine=ray``, how many replicas.
        replica_cpus: with ``engine=ray``, the CPUs each replica reserves on the cluster; Ray gives its
            libraries that many threads (``OMP_NUM_THREADS``) unless ``runner.threads`` says otherwise.
        replica_gpus: with ``engine=ray``, the GPUs each replica reserves (needed for a stage on ``cuda``:
            Ray hides the GPUs from a replica that asks for none).
        ice_servers: WebRTC calls: the STUN and TURN servers the server gathers its ICE candidates through, each
            ``{urls, username, credential}`` (a TURN server needs the last two); none: host candidates only
            (this machine's addresses: enough on one network, not behind a NAT).
        call_connect_timeout_s: a WebRTC call whose connection is not up this long after its answer is released.
    """

    host: str
    port: Annotated[int, Range(0, 65535)]
    max_sessions: Annotated[int, Range(1, 64)]
    api_key: str | None
    max_frame_bytes: Annotated[int, Range(1024, 64 << 20)]
    min_rate: Annotated[int, RATE]
    max_rate: Annotated[int, RATE]
    max_instructions_chars: Annotated[int, Range(1)]
    idle_timeout_s: Annotated[float, Range(0, exclusive=True)]
    max_queued_events: Annotated[int, Range(16, 1 << 20)] = 1024
    partial_transcripts_s: Annotated[float, Range(0.3, 10)] | None = 1.0
    log_transcripts: bool = False
    visemes: bool = False
    engine: Annotated[str, OneOf(("local", "ray"))] = "local"
    replicas: Annotated[int, Range(1, 64)] = 1
    replica_cpus: Annotated[float, Range(0, 256)] = 1.0
    replica_gpus: Annotated[float, Range(0, 64)] = 0.0
    ice_servers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    call_connect_timeout_s: Annotated[float, Range(1, 300)] = 20.0

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        """The rules one annotation cannot state: a host, a key long enough, rates in order, and no replica key
        without ``engine=ray`` (it would be ignored)."""
        errors = []
        if not kwargs["host"]:
            errors.append(context.error("host", kwargs["host"], "a host name or address (127.0.0.1 keeps it on "
                                                                "this machine)"))
        if kwargs["api_key"] is not None and len(kwargs["api_key"]) < 8:
            errors.append(context.error("api_key", "<hidden>", "null or a key of 8+ characters"))
        if kwargs["min_rate"] > kwargs["max_rate"]:
            errors.append(context.error("min_rate", kwargs["min_rate"], f"at most server.max_rate "
                                                                        f"({kwargs['max_rate']})"))
        errors += _ice_server_errors(kwargs.get("ice_servers") or [], context)
        if kwargs.get("engine", "local") == "local":
            defaults = {field.name: field.default for field in fields(cls) if field.name.startswith("replica")}
            errors += [context.error(key, kwargs[key], f"{default:g} with server.engine=local (replicas need "
                                                       f"server.engine=ray)")
                       for key, default in defaults.items() if key in kwargs and kwargs[key] != default]
        if errors:
            raise ConfigErrors(errors)


ICE_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")


def _ice_server_errors(servers: list[Any], context: ValidationContext) -> list[ConfigError]:
    """Each ICE server: ``urls`` (one or a list) of the ICE schemes; a TURN server with its username and
    credential; no other key."""
    errors = []
    for index, server in enumerate(servers):
        key = f"ice_servers[{index}]"
        if not isinstance(server, dict) or not set(server) <= {"urls", "username", "credential"} \
                or "urls" not in server:
            errors.append(context.error(key, server, "{urls: 'stun:host:port' or a list of them, username, "
                                                     "credential} (username and credential for TURN only)"))
            continue
        urls = [server["urls"]] if isinstance(server["urls"], str) else server["urls"]
        if not isinstance(urls, list) or not urls or not all(isinstance(url, str) and url.startswith(ICE_SCHEMES)
                                                             for url in urls):
            errors.append(context.error(f"{key}.urls", server["urls"], f"one URL or a list of them, each "
                                                                       f"starting with {', '.join(ICE_SCHEMES)}"))
        elif any(url.startswith("turn") for url in urls) and not (isinstance(server.get("username"), str)
                                                                    and isinstance(server.get("credential"), str)):
            errors.append(context.error(f"{key}.credential", "<hidden>", "a TURN server's username and credential "
                                                                         "(strings)"))
    return errors


def read_settings(cfg: DictConfig) -> tuple[ServerSettings | None, list[ConfigError]]:
    """``cfg.server`` bound to :class:`ServerSettings`: the settings, or None and one error per bad key."""
    _, kwargs, errors = node_kwargs(cfg.server, "server")
    if kwargs.get("api_key") == "":  # S2S_API_KEY set but empty: no key, as when it is unset
        kwargs["api_key"] = None
    return bind(ServerSettings, kwargs, errors, cfg, "server")
