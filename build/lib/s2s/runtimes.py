"""Runtime libraries that some platforms cannot run, as stages declare them and the validator checks them.

The platform configs say where a runtime has no wheels, and why (``platform.unavailable: {name: reason}``); a
stage names the runtime it needs in ``Stage.requires``. ``s2s.config`` compares the two before anything loads,
with the functions below, so no backend looks at the platform itself.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from s2s.config_errors import ConfigError, ValidationContext


@dataclass(frozen=True)
class Runtime:
    """One runtime library and what else it needs.

    Attributes:
        name: its key in ``platform.unavailable`` (mlx, onnxruntime, qwentts_cpp, cuda_graphs).
        option: for a stage that needs the runtime whatever its keys: the option's name in its group (mlx_lm),
            the value its error names.
        instead: with ``option``: an option the error suggests where the runtime cannot run (llm=transformers).
        device: a device the runtime also needs (cuda): the stage's ``device`` must be one.
        device_reason: why, in the error on ``device``.
    """

    name: str
    option: str | None = None
    instead: str | None = None
    device: str | None = None
    device_reason: str = ""


@dataclass(frozen=True)
class ByBackend:
    """The runtime a stage needs, picked by the value of its ``backend`` key (None: that backend runs anywhere).

    ``none_left`` is what the error asks for on a platform where none of the backends runs.
    """

    runtimes: Mapping[str, Runtime | None]
    none_left: str = "another option"


def required_runtime(requires: Runtime | ByBackend, arguments: dict[str, Any]) -> Runtime | None:
    """The runtime a stage needs with these arguments (a :class:`ByBackend` reads the ``backend`` key)."""
    return requires.runtimes[arguments["backend"]] if isinstance(requires, ByBackend) else requires


def unavailable_error(requires: Runtime | ByBackend, arguments: dict[str, Any],
                      context: ValidationContext) -> ConfigError | None:
    """The error for a stage whose runtime the target platform cannot run, or None.

    A whole-stage runtime names the option (``llm=mlx_lm``) and suggests another; a per-backend one names the
    ``backend`` and lists those that run here (a device they need is said), or ``none_left`` when none does.
    """
    runtime = required_runtime(requires, arguments)
    if runtime is None or runtime.name not in context.unavailable:
        return None
    where = f"on platform {context.platform} ({context.unavailable[runtime.name]})"
    if isinstance(requires, Runtime):
        instead = f", e.g. {runtime.instead}" if runtime.instead else ""
        return ConfigError(context.group, runtime.option, f"another option {where}{instead}")
    allowed = [name + (f" (with a {other.device.upper()} device)" if other and other.device
                       and context.accelerator != other.device else "")
               for name, other in requires.runtimes.items() if other is None or other.name not in context.unavailable]
    expected = (requires.none_left if not allowed else allowed[0] if len(allowed) == 1
                else "one of " + ", ".join(allowed))
    return context.error("backend", arguments["backend"], f"{expected} {where}")


def device_error(requires: Runtime | ByBackend, arguments: dict[str, Any],
                 context: ValidationContext) -> ConfigError | None:
    """The error on ``device`` when the stage's runtime needs a device (cuda) that ``device`` is not, or None."""
    runtime = required_runtime(requires, arguments)
    if runtime is None or runtime.device is None or str(arguments.get("device")).startswith(runtime.device):
        return None
    return context.error("device", arguments.get("device"), f"{runtime.device}: {runtime.device_reason}")
