"""The schema of a config group: its ``_target_``'s constructor signature, read without building anything.

Keys must bind to the signature; ``Literal`` annotations are enums, ``Annotated[..., Range(...)]`` and
``Annotated[..., OneOf(...)]`` bound values, ``Annotated[..., MUST_EXIST]`` marks paths that must exist, plain
``int``/``float``/``bool``/``str`` annotations are type-checked, and a ``device`` must exist on the platform.
A stage's ``requires`` and ``validate_config`` add its own rules (:func:`stage_rule_errors`). Stages may use
these to judge a change at run time (:func:`override_errors`): they sit below every stage.
"""
from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from s2s import runtimes
from s2s.config_errors import MUST_EXIST, ConfigError, ConfigErrors, OneOf, Range, ValidationContext
from s2s.platform import DEVICES, valid_device
from s2s.stage import Stage


def device_unavailable(device: str, platform: str, accelerator: str) -> str | None:
    """Why ``device`` cannot work on the target platform, or None (auto and cpu always can)."""
    if device.startswith("cuda") and accelerator != "cuda":
        return f"auto or cpu: platform {platform} has no CUDA (a machine with an NVIDIA GPU is {platform}_cuda)"
    if device == "mps" and accelerator != "mps":
        return f"auto or cpu: MPS exists only on Apple silicon (platform macos), not on {platform}"
    return None


def describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(choice) for choice in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arm) for arm in typing.get_args(annotation))
    if origin is typing.Annotated:
        return describe(typing.get_args(annotation)[0])
    if annotation is type(None):
        return "null"
    return {float: "a number", int: "an integer", bool: "true or false", str: "a string"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is inspect.Parameter.empty:
        return True
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arm) for arm in typing.get_args(annotation))
    if origin is typing.Annotated:
        return matches(value, typing.get_args(annotation)[0])
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, typing.Sequence) or annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or annotation is dict:
        return isinstance(value, Mapping)
    return True  # richer annotations are the class's own business (validate_config)


def constraints(annotation: Any, value: Any = inspect.Parameter.empty) -> list[Range | OneOf]:
    """The Range/OneOf markers of an annotation, looking inside Optional[...] too.

    With ``value``, only the markers of the union arms it matches: in ``str | Annotated[int, Range(0)]`` a name is
    not held to the number's bound.
    """
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return [m for m in typing.get_args(annotation)[1:] if isinstance(m, (Range, OneOf))]
    if origin in (typing.Union, types.UnionType):
        return [m for arm in typing.get_args(annotation) if value is inspect.Parameter.empty or matches(value, arm)
                for m in constraints(arm)]
    return []


def must_exist(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return MUST_EXIST in typing.get_args(annotation)[1:]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(must_exist(arm) for arm in typing.get_args(annotation))
    return False


def check_kwargs(cls: type, kwargs: dict[str, Any], context: ValidationContext) -> list[ConfigError]:
    """Bind ``kwargs`` to the constructor and check each value against its annotation.

    Args:
        cls: a stage, or any class whose signature is a config group's schema (the server's settings).
        kwargs: the config node's keys and values, ``_target_`` removed.
        context: the group (errors are named ``<group>.<key>``) and the platform (a ``device`` must exist there).

    Returns:
        One error per unknown or missing key and per value its annotation (type, ``Literal``, ``Range``,
        ``OneOf``, ``MUST_EXIST``) refuses; empty when all bind.
    """
    signature = inspect.signature(cls)
    errors: list[ConfigError] = []
    known = [name for name, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD]
    for key in kwargs:
        if key not in signature.parameters:
            errors.append(context.error(key, kwargs[key], f"a known key; {cls.__module__}.{cls.__name__} "
                                                          f"takes: {', '.join(known)}"))
    for name, parameter in signature.parameters.items():
        if parameter.default is parameter.empty and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD,
                                                                      parameter.KEYWORD_ONLY) and name not in kwargs:
            errors.append(context.error(name, "<missing>", "a value (the key is required)"))
    if not errors:
        signature.bind(**kwargs)  # cannot fail now; kept as the contract the checks above spell out
    hints = typing.get_type_hints(cls.__init__, include_extras=True)
    for key, value in kwargs.items():
        annotation = hints.get(key, inspect.Parameter.empty)
        if key not in signature.parameters:
            continue
        if key == "device":
            if not (isinstance(value, str) and valid_device(value)):
                errors.append(context.error(key, value, f"one of {', '.join(DEVICES)} (or cuda:N)"))
            elif problem := device_unavailable(value, context.platform, context.accelerator):
                errors.append(context.error(key, value, problem))
            continue
        if not matches(value, annotation):
            errors.append(context.error(key, value, describe(annotation)))
        elif value is not None and (broken := [c for c in constraints(annotation, value) if not c.check(value)]):
            errors.append(context.error(key, value, broken[0].describe()))
        elif value is not None and must_exist(annotation) and not Path(str(value)).expanduser().exists():
            errors.append(context.error(key, value, "an existing path (no such file or directory)"))
    return errors


def stage_rule_errors(cls: type, kwargs: dict[str, Any], context: ValidationContext) -> list[ConfigError]:
    """What ``cls.requires`` and ``cls.validate_config`` say of ``kwargs`` (already checked by :func:`check_kwargs`).

    A runtime the platform cannot run is the only error reported for the stage (its other rules assume it runs
    here); a device the runtime lacks comes before the stage's own rules. ``validate_config`` receives the bound
    arguments with the constructor's defaults applied, so it reads every key directly.
    """
    bound = inspect.signature(cls).bind(**kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    errors: list[ConfigError] = []
    if issubclass(cls, Stage) and cls.requires is not None:
        if unavailable := runtimes.unavailable_error(cls.requires, arguments, context):
            return [unavailable]
        if device := runtimes.device_error(cls.requires, arguments, context):
            errors.append(device)
    try:
        cls.validate_config(arguments, context)
    except ConfigErrors as many:
        return errors + list(many.errors)
    except ConfigError as error:
        return errors + [error]
    return errors


def override_errors(cls: type, kwargs: dict[str, Any], overrides: dict[str, Any], context: ValidationContext) -> list:
    """What the stage's own rules say of its ``kwargs`` changed by ``overrides`` (a session's or a runtime change)."""
    return check_kwargs(cls, merged := {**kwargs, **overrides}, context) or stage_rule_errors(cls, merged, context)
