"""OpenTelemetry traces of a run and of every server session: ``tracing=otlp`` or ``tracing=console``.

The ``tracing`` group binds to one of the settings classes below, as a stage's group binds to its constructor:
their annotations say what each key may be, and :func:`read_settings` checks them before anything loads. The
spans are built from the metrics Recorder's records once a turn is over (:mod:`s2s.spans`), with the times
the Recorder measured, so nothing runs on the audio path; a BatchSpanProcessor exports them from its own thread.
A backend that is down costs one warning and the spans of the time it is down, never a turn's time; at the end,
the last spans get at most ``shutdown_timeout_s`` to leave (none when the backend is already known to be down).
"""
from __future__ import annotations

import importlib.metadata
import logging
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlsplit

from omegaconf import DictConfig

from s2s.config import StageSpec, node_kwargs
from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.metrics import Recorder
from s2s.settings_node import bind
from s2s.stage import require

log = logging.getLogger("s2s.tracing")
TRACES_PATH = "/v1/traces"  # OTLP/HTTP: the exporter posts to <endpoint>/v1/traces
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
# The loggers the SDK's exporter and batch processor report failures on, per batch and per retry: the one
# warning of :class:`_Health` says it instead.
SDK_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk._shared_internal")


@dataclass(frozen=True, kw_only=True)
class NoTracing:
    """``tracing=none`` (the default): no spans, and the OpenTelemetry SDK is never imported."""

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        """Nothing to check: the option has no keys."""


@dataclass(frozen=True, kw_only=True)
class Exported:
    """What every option that exports spans has.

    Args:
        service_name: ``service.name`` of every span (tells runs and servers apart in the backend).
        text: the user's and the assistant's words go into the turn spans too (off: figures only).
    """

    service_name: str = "s2s"
    text: bool = False

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        """A service name to tell this process's spans by."""
        if not kwargs["service_name"].strip():
            raise context.error("service_name", repr(kwargs["service_name"]), "a non-empty name, e.g. s2s")

    def exporter(self) -> Any:
        """The SDK's span exporter (imported here: the SDK is the ``tracing`` extra's)."""
        raise NotImplementedError

    def where(self) -> str:
        """Where the spans go, as the log says it."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class ConsoleTracing(Exported):
    """``tracing=console``: each span as one line on stdout, when its batch is exported."""

    def exporter(self) -> Any:
        export = require("opentelemetry.sdk.trace.export", backend="tracing=console", extra="tracing")
        return export.ConsoleSpanExporter(out=sys.stdout, formatter=one_line)

    def where(self) -> str:
        return "the console"


@dataclass(frozen=True, kw_only=True)
class OtlpTracing(Exported):
    """``tracing=otlp``: spans over OTLP/HTTP (protobuf) to a collector, Jaeger or a vendor's endpoint.

    Args:
        service_name: as for ``tracing=console``; text too.
        endpoint: the OTLP/HTTP base, ``http(s)://host[:port]`` (and a path prefix some vendors give); spans
            are posted to ``<endpoint>/v1/traces``.
        headers: sent with every export (auth), over ``OTEL_EXPORTER_OTLP_HEADERS`` (sent too when set).
        timeout_s: one export's limit, retries included; exports run in their own thread.
        shutdown_timeout_s: at the end, how long the last spans may take to leave.
    """

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # auth: never in a log line
    timeout_s: Annotated[float, Range(0.1, 60)] = 5.0
    shutdown_timeout_s: Annotated[float, Range(0, 30)] = 1.0

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        """An endpoint that is an OTLP/HTTP base, headers that HTTP can carry, and a service name."""
        errors: list[ConfigError] = []
        try:
            super().validate_config(kwargs, context)
        except ConfigError as error:
            errors.append(error)
        if problem := endpoint_problem(kwargs["endpoint"]):
            errors.append(context.error("endpoint", kwargs["endpoint"], problem))
        for name, value in kwargs["headers"].items():
            if not (isinstance(name, str) and HEADER_NAME.fullmatch(name)):
                errors.append(context.error(f"headers.{name}", "<hidden>", "a header name (letters, digits, -)"))
            elif not isinstance(value, str) or not value or any(c in value for c in "\r\n\0"):
                errors.append(context.error(f"headers.{name}", "<hidden>", "a non-empty string on one line"))
        if errors:
            raise ConfigErrors(errors)

    def exporter(self) -> Any:
        http = require("opentelemetry.exporter.otlp.proto.http.trace_exporter", backend="tracing=otlp",
                       extra="tracing")
        return http.OTLPSpanExporter(endpoint=self.endpoint.rstrip("/") + TRACES_PATH, headers=self.headers,
                                     timeout=self.timeout_s)

    def where(self) -> str:
        return self.endpoint.rstrip("/") + TRACES_PATH


Settings = NoTracing | ConsoleTracing | OtlpTracing
OPTIONS: dict[str, type[Settings]] = {f"{__name__}.{cls.__name__}": cls
                                      for cls in (NoTracing, ConsoleTracing, OtlpTracing)}


def endpoint_problem(url: Any) -> str | None:
    """What is wrong with ``url`` as an OTLP/HTTP base, or None."""
    expected = ("an OTLP/HTTP base URL, http(s)://host[:port] (e.g. http://127.0.0.1:4318; the spans are posted "
                "to <endpoint>/v1/traces)")
    if not isinstance(url, str):
        return expected
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is not a number from 0 to 65535 raises here
    except ValueError:
        return expected
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not (HEADER_NAME.fullmatch(host) or ":" in host) or port == 0:
        return expected
    if parts.username or parts.password or parts.query or parts.fragment:
        return expected + "; credentials go in tracing.headers, not in the URL"
    if parts.path.rstrip("/").endswith(TRACES_PATH):
        return expected + f"; without {TRACES_PATH}, which the exporter appends"
    return None


def read_settings(cfg: DictConfig) -> tuple[Settings | None, list[ConfigError]]:
    """``cfg.tracing`` bound to its class: the settings, or None and one error per bad key.

    A config without a ``tracing`` node (composed by hand) is ``tracing=none``.
    """
    node = cfg.get("tracing")
    if node is None:
        return NoTracing(), []
    if not isinstance(node, DictConfig):
        return None, [ConfigError("tracing", node, "an option of the tracing group: none, console or otlp")]
    target, kwargs, errors = node_kwargs(node, "tracing")
    cls = OPTIONS.get(target)
    if cls is None:
        return None, errors + [ConfigError("tracing._target_", target, "one of " + ", ".join(OPTIONS))]
    if cls is NoTracing and kwargs:  # the signature's own message would list no keys
        return None, errors + [ConfigError(f"tracing.{key}", value, "no key under tracing=none; tracing=otlp or "
                                           "tracing=console first") for key, value in kwargs.items()]
    return bind(cls, kwargs, errors, cfg, "tracing")


def one_line(span: Any) -> str:
    """A span as ``tracing=console`` prints it: name, duration, ids, attributes."""
    context, parent = span.get_span_context(), span.parent
    seconds = ((span.end_time or span.start_time) - span.start_time) / 1e9
    shown = " ".join(f"{key}={value}" for key, value in (span.attributes or {}).items())
    return (f"span {span.name} {seconds:.3f} s trace={context.trace_id:032x} span={context.span_id:016x} "
            f"parent={'-' if parent is None else f'{parent.span_id:016x}'} {shown}".rstrip() + "\n")


class _Health(logging.Filter):
    """Whether the backend takes our spans; says so once per outage, and keeps the SDK's per-batch lines out.

    It is a filter on the SDK's loggers: their first warning (a refused connection, a timeout, an HTTP error)
    is the news of an outage, and every later one is a repeat.
    """

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where, self.down = where, False
        self.closed = False  # we shut the exporter down: what it says after that is no outage
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and not self.closed:
            with self._lock:
                news, self.down = not self.down, True
            if news:
                log.warning("tracing: cannot export spans to %s (%s); the conversation goes on, and spans are "
                            "dropped until it answers (said once)", self.where, _reason(record))
        return False

    def exported(self) -> None:
        with self._lock:
            news, self.down = self.down, False
        if news:
            log.info("tracing: exporting spans to %s again", self.where)


def _reason(record: logging.LogRecord) -> str:
    """The cause in an SDK failure line: the OS error of a refused connection, else the exception, else the line."""
    for arg in record.args if isinstance(record.args, tuple) else ():
        if isinstance(arg, BaseException):
            found = re.search(r"\[Errno -?\d+\] [^\"')]+", str(arg))  # requests nests it three exceptions deep
            return found.group(0) if found else f"{type(arg).__name__}: {arg}"[:300]
    return record.getMessage()[:300]


class _Watched:
    """The exporter, with its outcome told to :class:`_Health` (the processor calls these three methods)."""

    def __init__(self, exporter: Any, health: _Health) -> None:
        self.exporter, self.health = exporter, health
        self._lock = threading.Lock()

    def export(self, spans: Any) -> Any:
        result = self.exporter.export(spans)
        if result.name == "SUCCESS":
            self.health.exported()
        return result

    def shutdown(self) -> None:
        with self._lock:
            closing, self.health.closed = not self.health.closed, True
        if closing:
            self.exporter.shutdown()  # also cuts short a retry's wait

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class _Exporting:
    """The process's span pipeline for one set of settings: provider, batch processor, exporter, health."""

    def __init__(self, settings: Exported) -> None:
        backend = f"tracing={'otlp' if isinstance(settings, OtlpTracing) else 'console'}"
        sdk = require("opentelemetry.sdk.trace", backend=backend, extra="tracing")
        export = require("opentelemetry.sdk.trace.export", backend=backend, extra="tracing")
        resources = require("opentelemetry.sdk.resources", backend=backend, extra="tracing")
        self.settings = settings
        self.health = _Health(settings.where())
        self.exporter = _Watched(settings.exporter(), self.health)
        for name in SDK_LOGGERS:
            logging.getLogger(name).addFilter(self.health)
        # 1 s instead of the SDK's 5: a turn's spans show up while the conversation goes on
        self.processor = export.BatchSpanProcessor(self.exporter, schedule_delay_millis=1000)
        version = _version()
        resource = resources.Resource.create({"service.name": settings.service_name,
                                              **({"service.version": version} if version else {})})
        provider = sdk.TracerProvider(resource=resource, shutdown_on_exit=False)  # our shutdown is bounded
        provider.add_span_processor(self.processor)
        self.tracer = provider.get_tracer("s2s", version)

    def shutdown(self) -> None:
        """Let the last spans go, for at most ``shutdown_timeout_s``, and none when the backend is down."""
        timeout_s = self.settings.shutdown_timeout_s if isinstance(self.settings, OtlpTracing) else 1.0
        if self.health.down:
            self.exporter.shutdown()
        # The processor's shutdown waits for its export thread without a bound of ours: wait for it this long
        closer = threading.Thread(target=self.processor.shutdown, name="s2s-tracing-shutdown", daemon=True)
        closer.start()
        closer.join(timeout_s)
        if closer.is_alive():  # a slow or silent backend: stop its retries; a request in flight ends on its own
            self.exporter.shutdown()
            return  # the filter stays: that request's failure, when it comes, is no news
        for name in SDK_LOGGERS:
            logging.getLogger(name).removeFilter(self.health)


def _version() -> str | None:
    """The installed s2s's version (read from its metadata: importing the package from here would be a circle)."""
    try:
        return importlib.metadata.version("s2s")
    except importlib.metadata.PackageNotFoundError:
        return None


_lock = threading.Lock()
_current: _Exporting | None = None


def start(cfg: DictConfig) -> _Exporting | None:
    """The span pipeline for ``cfg.tracing`` (already validated), set up once per process; None for ``none``.

    Raises:
        MissingExtraError: the ``tracing`` extra is not installed.
    """
    global _current
    settings, _ = read_settings(cfg)
    if not isinstance(settings, Exported):
        return None
    with _lock:
        if _current is not None and _current.settings != settings:
            _current.shutdown()
            _current = None
        if _current is None:
            _current = _Exporting(settings)
            log.info("tracing: spans go to %s", settings.where())
        return _current


def follow(cfg: DictConfig, recorder: Recorder, kind: str, specs: list[StageSpec],
           attributes: dict[str, Any] | None = None) -> None:
    """Trace what ``recorder`` records: a root span named ``kind`` from now, a span tree per finished turn.

    Args:
        cfg: the composed config; nothing happens under ``tracing=none``.
        recorder: the run's or the session's metrics.
        kind: ``run`` or ``session``, the root span's name.
        specs: the validated stages: each stage span names its backend and model.
        attributes: the root span's own (a session's ``session.id``).
    """
    exporting = start(cfg)
    if exporting is None:
        return
    from s2s.spans import TurnSpans

    recorder.listen(TurnSpans(exporting.tracer, kind, specs, recorder, attributes or {}, exporting.settings.text))


def shutdown() -> None:
    """Flush and stop the process's tracing (bounded); a later :func:`start` sets it up again."""
    global _current
    with _lock:
        current, _current = _current, None
    if current is not None:
        current.shutdown()
