"""One composed job: every check in one pass, then the runner (one run over source and sink) or the server.

The entry (s2s/entry.py, which ``python run.py`` and ``python -m s2s`` go through) and the command-line check
(:func:`s2s.preflight.check`) both use :func:`problems`, so a config with a bad stage key, a bad tracing key and a bad
server key gets all three lines at once, before any model loads. The runner (s2s/app.py) never knows that a
server exists.
"""
from __future__ import annotations

from omegaconf import DictConfig

from s2s import app, tracing
from s2s.config import StageSpec, validate
from s2s.config_errors import EXIT_CONFIG, ConfigError, ConfigErrors


def problems(cfg: DictConfig) -> tuple[list[StageSpec], list[ConfigError]]:
    """The stages of ``cfg`` and every problem of it: the stage groups, ``tracing`` and, for ``server=...``, the
    server's keys, its pipeline's shape and its engine. Each key is reported once; the stages are [] when
    anything is wrong."""
    try:
        specs, errors = validate(cfg), []
    except ConfigErrors as found:
        specs, errors = [], list(found.errors)
    errors += tracing.read_settings(cfg)[1]
    if cfg.get("server"):
        from s2s.server.launch import checked
        from s2s.server.settings import read_settings

        errors += checked(cfg, specs)[1] if specs else read_settings(cfg)[1]
    once: dict[str, ConfigError] = {}
    for error in errors:  # a key two checks look at (tracing._target_ outside s2s) is one line
        once.setdefault(error.key, error)
    errors = list(once.values())
    return ([], errors) if errors else (specs, [])


def run(cfg: DictConfig) -> int:
    """Check ``cfg`` (one line per problem, exit 2), then serve it or run it once; returns the exit code.

    Args:
        cfg: the composed config (Hydra composes it for the entry; benchmarks and tests may compose their own).
    """
    specs, errors = problems(cfg)
    if errors:
        app.report_config_errors(cfg, errors)
        return EXIT_CONFIG
    if cfg.get("server"):  # one graph per client session instead of one run over source/sink
        from s2s import server

        return app.traced(cfg, lambda: server.main(cfg, specs))
    return app.run_once(cfg, specs)
