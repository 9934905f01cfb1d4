"""Command-line front: the detected platform, and one clear line per problem where Hydra would print a page.

``run.py`` hands the command line to Hydra unchanged except for ``platform=<detected>``. Hydra composes the
config once; :func:`install` wraps that composition, so that

* an override Hydra refuses (unknown group option, unknown key) is explained after the refusal, together with
  every bad value among the other overrides, one line each, exit code 2;
* a ``_target_`` outside the s2s package anywhere in the composed config, ``hydra.*`` included, is refused
  before Hydra instantiates anything (only Hydra's own launcher and sweeper plugins are let through).
"""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from s2s.config_errors import ConfigErrors
from s2s.platform import detect

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
EXIT_CONFIG = 2


def group_options(group: str) -> list[str]:
    """User-facing options of a config group (files starting with '_' are bases)."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml") if not path.name.startswith("_"))


def config_groups() -> list[str]:
    """Groups a user selects (``hydra`` is Hydra's own; ``*_platform`` are applied automatically)."""
    return sorted(path.name for path in CONF_DIR.iterdir() if path.is_dir() and not path.name.startswith("_")
                  and path.name != "hydra" and not path.name.endswith("_platform"))


def _is_override(arg: str) -> bool:
    return not arg.startswith("-") and ("=" in arg or arg.startswith("~"))


def prepare_argv(argv: list[str]) -> list[str]:
    """Flags first, then the overrides, with ``platform=<detected>`` added unless the user chose one.

    Hydra takes the overrides as one run of positional arguments after its flags; moving every argument that
    is not an override (flags and their values, in their order) in front lets ``--cfg job`` or ``-m`` stand
    anywhere on the line.
    """
    flags = [arg for arg in argv if not _is_override(arg)]
    overrides = [arg for arg in argv if _is_override(arg)]
    if not any(arg.lstrip("+~").split("=", 1)[0] == "platform" for arg in overrides):
        overrides.append(f"platform={detect().platform}")
    return [*flags, *overrides]


# ---------------------------------------------------------------------------------------------- refusals
def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _culprit(message: str, overrides: list[str]) -> str | None:
    found = re.search(r"Could not (?:find|load) '([^']+)'", message) or \
        re.search(r"Could not (?:override|append to|delete from) '([^']+)'", message)
    if not found:
        return None
    name = found.group(1)
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if name in (key, f"{key}/{value}") or name.endswith(f"{key}/{value}"):
            return override
    return None


def _explain(override: str, cfg: DictConfig | None) -> str:
    key, _, value = override.partition("=")
    bare = key.lstrip("+~")
    if "." not in bare and (CONF_DIR / bare).is_dir():
        return f"{bare}={value}: unknown option for config group '{bare}'; valid: {', '.join(group_options(bare))}"
    if "." not in bare:
        return f"{bare}={value}: unknown key; config groups are: {', '.join(config_groups())}"
    parent, _, leaf = bare.rpartition(".")
    node = OmegaConf.select(cfg, parent) if cfg is not None else None
    valid = ", ".join(str(k) for k in node.keys() if k != "_target_") if isinstance(node, DictConfig) else "?"
    return f"{bare}={value}: unknown key '{leaf}' in '{parent}'; valid keys: {valid}"


def explain_refusal(compose: Any, overrides: list[str], error: Exception) -> list[str]:
    """Hydra refused ``overrides``: name each bad one, then every bad value among the rest, one line each."""
    from hydra.errors import ConfigCompositionException, MissingConfigException

    problems: list[str] = []
    culprits: list[str] = []
    remaining = list(overrides)
    cfg = None
    for _ in range(len(overrides) + 1):
        culprit = _culprit(str(error), remaining)
        if culprit is None:
            problems.append(str(error).strip().splitlines()[0])
            break
        culprits.append(culprit)
        remaining.remove(culprit)
        try:
            cfg = compose(remaining)
            break
        except (MissingConfigException, ConfigCompositionException) as again:
            error = again
        except Exception as again:  # grammar errors and the like: Hydra's first line says it well
            problems.append(str(again).strip().splitlines()[0])
            break
    problems += [_explain(culprit, cfg) for culprit in culprits]
    if cfg is not None:  # the rest composed: report its bad values in the same pass
        from s2s.config import validate

        with open_dict(cfg):  # nothing runs: the run folder Hydra would make is not needed to check values
            cfg.output_dir = "."
        try:
            validate(cfg)
        except ConfigErrors as errors:
            problems += [str(e) for e in errors.errors]
    return problems


def fail(problems: list[str]) -> None:
    for problem in problems:
        print(f"config error: {problem}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG)


def install() -> None:
    """Wrap Hydra's composition (of the run, the sweep and each sweep job) with the explanations and the check."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import ConfigCompositionException, MissingConfigException

    from s2s.config import target_errors

    original = ConfigLoaderImpl.load_configuration
    if getattr(original, "s2s_guard", False):
        return

    @functools.wraps(original)
    def load_configuration(self: ConfigLoaderImpl, config_name: str | None, overrides: list[str], run_mode: Any,
                           *args: Any, **kwargs: Any) -> DictConfig:
        try:
            cfg = original(self, config_name, overrides, run_mode, *args, **kwargs)
        except (MissingConfigException, ConfigCompositionException) as error:
            def compose(subset: list[str]) -> DictConfig:
                return original(self, config_name, subset, run_mode, *args, **kwargs)
            fail(explain_refusal(compose, list(overrides), error))
        if errors := target_errors(cfg):  # before Hydra instantiates its callbacks, launcher or sweeper
            fail([str(error) for error in errors])
        return cfg

    load_configuration.s2s_guard = True  # type: ignore[attr-defined]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
