"""Validation of a composed config, before any stage is built or any model loads.

The constructor signature of each ``_target_`` is the schema (:mod:`s2s.schema` reads it). A stage's
``requires`` names a runtime some platforms lack (checked against ``platform.unavailable`` through
:mod:`s2s.runtimes`), and each stage may add cross-field rules in ``validate_config``.
"""
from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from s2s.compose import group_options
from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.messages import SpeechSegment, Transcript
from s2s.platform import DEVICES, detect, resolve_device, runtimes_unavailable, valid_device
from s2s.allowlist import ALLOWED_PACKAGE, target_errors
from s2s.schema import check_kwargs, constraints, describe, device_unavailable, matches, stage_rule_errors
from s2s.stage import Stage

# Top-level keys the runner itself reads, with what they accept.
TOP_LEVEL: dict[str, Any] = {"dry_run": bool, "audio.sample_rate": typing.Annotated[int, Range(8000, 192000)],
                             "runner.barge_in": bool, "runner.half_duplex": typing.Optional[bool],
                             "runner.stop_timeout_s": typing.Annotated[float, Range(0.1, 60)],
                             "runner.warm_up": bool,
                             "runner.first_audio_wait_s": typing.Annotated[float, Range(0, 60)]}


@dataclass
class StageSpec:
    """A validated stage: its group name, class and constructor keyword arguments (device resolved)."""

    group: str
    target: str
    cls: type[Stage]
    kwargs: dict[str, Any]
    threads: int | None = None  # runner.threads.<group>: the CPU threads its library may use

    def build(self) -> Stage:
        stage = self.cls(**self.kwargs)
        stage.threads = self.threads
        return stage


def describe_graph(cfg: DictConfig, specs: list[StageSpec]) -> str:
    """The graph a run would build: one line per stage with its target and identifying values (a dry run's output).

    Args:
        cfg: the composed config (its platform names the line above the stages).
        specs: the validated stages, in pipeline order; each is built, which loads nothing by the stage contract.

    Returns:
        The lines, joined, without a trailing newline.
    """
    lines = [f"graph for platform={cfg.platform.name} (device auto -> {cfg.platform.accelerator}):"]
    width = max(len(spec.group) for spec in specs)
    for spec in specs:
        stage = spec.build()  # constructors are cheap by contract: no model, no heavy import
        details = {"device": spec.kwargs["device"]} if "device" in spec.kwargs else {}
        details.update(stage.describe())
        shown = "  ".join(f"{key}={value}" for key, value in details.items())
        lines.append(f"  {spec.group:<{width}}  {spec.target}  {shown}".rstrip())
    return "\n".join(lines)


def load_target(target: Any, key: str) -> type[Stage]:
    """Import a ``_target_`` class, refusing anything outside the s2s package or not a Stage."""
    if not isinstance(target, str) or not target.startswith(ALLOWED_PACKAGE + "."):
        raise ConfigError(key, target, f"a class inside the '{ALLOWED_PACKAGE}' package "
                                       f"(other callables are refused for safety)")
    module_name, _, attribute = target.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(key, target, f"an importable s2s stage class ({type(error).__name__}: {error})") from None
    if not (inspect.isclass(cls) and issubclass(cls, Stage)):
        raise ConfigError(key, target, "a subclass of s2s.stage.Stage")
    return cls


def node_kwargs(node: DictConfig, group: str) -> tuple[Any, dict[str, Any], list[ConfigError]]:
    """A config node's ``_target_`` and keyword arguments (resolved), with an error per missing or broken value."""
    errors: list[ConfigError] = []
    kwargs: dict[str, Any] = {}
    for key in node:
        try:
            value = node[key]
            if isinstance(value, DictConfig) or OmegaConf.is_list(value):
                value = OmegaConf.to_container(value, resolve=True)
            kwargs[str(key)] = value
        except MissingMandatoryValue:
            errors.append(ConfigError(f"{group}.{key}", "???", "a value (this key is required)"))
        except InterpolationResolutionError as error:
            errors.append(ConfigError(f"{group}.{key}", OmegaConf.to_container(node, resolve=False)[key],
                                      f"a resolvable interpolation ({error})"))
    target = kwargs.pop("_target_", None)
    return target, kwargs, errors


def validation_context(cfg: DictConfig, group: str, fed: tuple[type, ...] = ()) -> ValidationContext:
    platform = cfg.platform
    # what the platform config says (more specific, e.g. Intel Macs) over where each runtime's extra installs
    unavailable = {**runtimes_unavailable(str(platform.os)),
                   **OmegaConf.to_container(platform.get("unavailable") or DictConfig({}))}
    return ValidationContext(group, str(platform.name), str(platform.os), str(platform.accelerator), unavailable,
                             here=str(platform.os) == detect().os, fed=fed)


def validate(cfg: DictConfig) -> list[StageSpec]:
    """Check the whole composed config before anything is built or loaded.

    Args:
        cfg: the composed config.

    Returns:
        The stage specs in pipeline order (each stage's ``device`` resolved for the platform).

    Raises:
        ConfigErrors: every problem found, at once: runner keys, thread budgets, targets outside the package,
            each stage's keys and rules, and neighbours that do not fit.
    """
    errors: list[ConfigError] = []
    device = cfg.get("device")
    device_error: ConfigError | None = None
    if not isinstance(device, str) or not valid_device(device):
        device_error = ConfigError("device", device, f"one of {', '.join(DEVICES)} (or cuda:N)")
    elif problem := device_unavailable(device, str(cfg.platform.name), str(cfg.platform.accelerator)):
        device_error = ConfigError("device", device, problem)
    for key, annotation in TOP_LEVEL.items():
        value = OmegaConf.select(cfg, key)
        if not matches(value, annotation):
            errors.append(ConfigError(key, value, describe(annotation)))
        elif value is not None and (broken := [c for c in constraints(annotation) if not c.check(value)]):
            errors.append(ConfigError(key, value, broken[0].describe()))
    threads = OmegaConf.select(cfg, "runner.threads")
    if threads is not None and not isinstance(threads, DictConfig):
        errors.append(ConfigError("runner.threads", threads, "a mapping of stage group to thread count, "
                                                             "e.g. {stt: 2, llm: 1, tts: 2}"))
    for group, count in (threads or {}).items():
        if count is not None and group not in (cfg.get("pipeline") or []):
            errors.append(ConfigError(f"runner.threads.{group}", count, "a key naming a stage of the pipeline: "
                                      + ", ".join(cfg.get("pipeline") or [])))
        elif count is not None and not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 256):
            errors.append(ConfigError(f"runner.threads.{group}", count, "null or a number from 1 to 256"))
    stage_targets = {f"{group}._target_" for group in cfg.get("pipeline") or []}
    errors += [e for e in target_errors(cfg) if e.key not in stage_targets]  # stages' own: load_target below
    specs: list[StageSpec] = []
    fed: tuple[type, ...] = ()  # what the stage before emits (unknown when it failed to load)
    for group in cfg.pipeline:
        fed, before = (), fed
        node = cfg.get(group)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            errors.append(ConfigError("pipeline", group, "names of config groups that select a stage "
                                                          "(each needs a _target_)"))
            continue
        target, kwargs, problems = node_kwargs(node, group)
        errors += problems
        try:
            cls = load_target(target, f"{group}._target_")
        except ConfigError as error:
            errors.append(error)
            continue
        fed = cls.emits
        context = validation_context(cfg, group, before)
        reported = {error.key for error in problems}
        kwarg_errors = [e for e in check_kwargs(cls, kwargs, context) if e.key not in reported]
        errors += kwarg_errors
        if "device" in kwargs and isinstance(kwargs["device"], str) and valid_device(kwargs["device"]):
            kwargs["device"] = resolve_device(kwargs["device"], context.accelerator)
        if not kwarg_errors and not problems:
            errors += stage_rule_errors(cls, kwargs, context)
        specs.append(StageSpec(group, target, cls, kwargs, (threads or {}).get(group)))
    if device_error:  # stages that take the top-level device repeat its error: say it once
        errors = [device_error] + [e for e in errors if not (e.key.endswith(".device") and e.value == device)]
    if not errors:  # with a stage missing, its neighbours would be compared with the wrong stage
        errors = _check_neighbours(specs)
    if errors:
        raise ConfigErrors(errors)
    return specs


def _check_neighbours(specs: list[StageSpec]) -> list[ConfigError]:
    """Each stage must consume what the one before it emits (source=sentences needs experiment=tts_benchmark).

    Utterances straight into a stage that takes transcripts is ``stt=none`` before an LLM that reads text only:
    that is said in the terms the user chose (``stt``, ``llm``) with the combinations that work.
    """
    errors = []
    for before, after in zip(specs, specs[1:]):
        if before.cls.emits and after.cls.accepts and not any(
                issubclass(kind, after.cls.accepts) for kind in before.cls.emits):
            if SpeechSegment in before.cls.emits and Transcript in after.cls.accepts:
                stts = ", ".join(f"stt={name}" for name in group_options("stt") if name != "none")
                errors.append(ConfigError("stt", "none", f"an STT ({stts}) before {after.group} ({after.target}), "
                                          f"which reads text only; stt=none sends the audio to the LLM and works "
                                          f"only with llm=openai (a model that takes input_audio)"))
                continue
            emits = ", ".join(kind.__name__ for kind in before.cls.emits)
            accepts = ", ".join(kind.__name__ for kind in after.cls.accepts)
            errors.append(ConfigError("pipeline", "[" + ", ".join(spec.group for spec in specs) + "]",
                                      f"neighbours that fit: {before.group} ({before.target}) emits {emits} but "
                                      f"{after.group} ({after.target}) accepts {accepts}"))
    return errors
