"""The ``_target_`` allowlist: the callables s2s lets Hydra instantiate, checked on a composed config.

Light on purpose (omegaconf only): the guard on Hydra's config loader (:mod:`s2s.hydra_guard`) runs it on every
composition, ``s2s --cfg job`` included, so a command that only shows a config does not pay for the stages.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig

from s2s.config_errors import ConfigError

ALLOWED_PACKAGE = "s2s"
ALLOWED_TARGETS = (ALLOWED_PACKAGE + ".",)
# Hydra instantiates its launcher and sweeper from these packages when they are selected through their groups.
PLUGIN_TARGETS = ("hydra_plugins.", "hydra._internal.core_plugins.")
PLUGIN_NODES = ("hydra.launcher", "hydra.sweeper")
# logging.config.dictConfig imports whatever a handler's `class` or a factory's `()` names.
LOGGING_NODES = ("hydra.hydra_logging", "hydra.job_logging")
LOGGING_CALLABLES = ("logging.", "colorlog.", "hydra.")


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, key, value) of every leaf and node, without resolving interpolations."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            value = node._get_node(key)
            dotted = f"{path}.{key}" if path else str(key)
            yield dotted, key, value
            yield from _walk(value, dotted)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            value = node._get_node(index)
            yield f"{path}[{index}]", index, value
            yield from _walk(value, f"{path}[{index}]")


def _leaf(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return None
    try:
        return value._value() if hasattr(value, "_value") else value
    except Exception:  # an unresolvable interpolation is the validator's business, not a target
        return None


def target_errors(cfg: DictConfig) -> list[ConfigError]:
    """Every ``_target_`` (and logging factory) in the composed config that s2s would not instantiate."""
    errors = []
    for dotted, key, node in _walk(cfg, ""):
        value = _leaf(node)
        if key == "_target_":
            parent = dotted.rsplit(".", 1)[0]
            if isinstance(value, str) and value.startswith(ALLOWED_TARGETS):
                continue
            if parent.startswith(PLUGIN_NODES) and isinstance(value, str) and value.startswith(PLUGIN_TARGETS):
                continue
            errors.append(ConfigError(dotted, value, "a class inside the 's2s' package (other callables are "
                                                     "refused for safety; Hydra's launchers and sweepers are "
                                                     "chosen with hydra/launcher=... and hydra/sweeper=...)"))
        elif key in ("()", "class") and dotted.startswith(LOGGING_NODES):
            if not (isinstance(value, str) and value.startswith(LOGGING_CALLABLES)):
                errors.append(ConfigError(dotted, value, "a logging class (logging.*); other callables are "
                                                         "refused for safety"))
    return errors
