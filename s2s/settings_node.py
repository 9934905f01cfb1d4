"""A config node that is not a stage (``server``, ``tracing``) bound to its settings class, judged as a stage is."""
from __future__ import annotations

from typing import Any, TypeVar

from omegaconf import DictConfig

from s2s.config import validation_context
from s2s.schema import check_kwargs, stage_rule_errors
from s2s.config_errors import ConfigError

T = TypeVar("T")


def bind(cls: type[T], kwargs: dict[str, Any], problems: list[ConfigError], cfg: DictConfig,
         group: str) -> tuple[T | None, list[ConfigError]]:
    """``kwargs`` (the ``group`` node's, read by :func:`s2s.config.node_kwargs`) bound to ``cls``.

    The constructor's annotations judge each key, then ``cls.validate_config`` the whole; a key that reading the
    node already refused (``problems``) is reported once.

    Returns:
        The settings and no error, or None and one error per bad key.
    """
    context = validation_context(cfg, group)
    reported = {error.key for error in problems}
    errors = problems + [error for error in check_kwargs(cls, kwargs, context) if error.key not in reported]
    if not errors:
        errors = stage_rule_errors(cls, kwargs, context)
    return (None, errors) if errors else (cls(**kwargs), [])
