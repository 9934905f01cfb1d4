"""Command-line front: the detected platform, and one clear line per problem where Hydra would print a page.

``run.py`` hands the command line to Hydra unchanged except for ``platform=<detected>``. Before it does,
:func:`check` composes the same config through Hydra's public compose API, so that

* an override Hydra would refuse (unknown group option, unknown key) is explained, together with every bad
  value among the other overrides, one line each, exit code 2;
* a ``_target_`` outside the s2s package anywhere in a composed config, ``hydra.*`` included, is refused
  before Hydra instantiates anything (only Hydra's own launcher and sweeper plugins are let through), however
  the config was composed: :mod:`s2s.hydra_guard` checks every config Hydra composes, ``-cp``/``-cn``/``-cd``
  included, and ``--experimental-rerun`` (a pickle) is refused.

A sweep (``-m``) is checked as its first job would be composed, and every option a group sweep names must
exist, so a sweep is refused before its first job runs rather than halfway through.
"""
from __future__ import annotations

import re
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from s2s.compose import CONF_DIR, compose, config_groups, group_options, is_override
from s2s.config_errors import EXIT_CONFIG

# Flags that make Hydra compose another config than conf/config.yaml, or none: nothing to explain ahead of it
# (the guard still checks the targets of whatever Hydra composes).
OTHER_CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-sc",
                      "--shell-completion", "--experimental-rerun")


# ---------------------------------------------------------------------------------------------- refusals
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
        from s2s import job

        with open_dict(cfg):  # nothing runs: the run folder Hydra would make is not needed to check values
            cfg.output_dir = "."
        problems += [str(e) for e in job.problems(cfg)[1]]
    return problems


def fail(problems: list[str]) -> None:
    for problem in problems:
        print(f"config error: {problem}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG)


def _as_first_job(parsed: list[Any]) -> tuple[list[str], list[str]]:
    """A sweep's overrides as its first job gets them, and the options its group sweeps name that do not exist.

    Each sweep keeps its first value (for a group, its first existing option); glob and interval sweeps are
    left to the sweeper (a glob only finds options that exist).
    """
    overrides: list[str] = []
    problems: list[str] = []
    for override in parsed:
        if not override.is_sweep_override():
            overrides.append(override.input_line)
            continue
        if override.is_interval_sweep() or override.value_type.name == "GLOB_CHOICE_SWEEP":
            continue
        key = override.get_key_element()
        values = list(override.sweep_string_iterator())
        group = override.key_or_group
        if override.package is None and "." not in group and (CONF_DIR / group).is_dir():
            missing = [v for v in values if v != "null" and not (CONF_DIR / group / f"{v}.yaml").exists()]
            problems += [_explain(f"{key}={value}", None) for value in missing]
            values = [v for v in values if v not in missing]
        if values:
            overrides.append(f"{key}={values[0]}")
    return overrides, problems


def check(argv: list[str]) -> list[str]:
    """What is wrong with a command line (as :func:`s2s.compose.prepare_argv` orders it), one line each; empty: let Hydra go.

    The config is composed here exactly as Hydra is about to compose it. When that fails, each refused
    override is named (:func:`explain_refusal`). The guard (:mod:`s2s.hydra_guard`, which the entry points
    install before they call this) refuses a config with a ``_target_`` outside the allowlist, here and in every later
    composition of Hydra's, before it instantiates its callbacks, launcher or sweeper. Anything else (a grammar
    error in an override, a flag that points Hydra at another config) is left to Hydra, whose own message says
    it well.

    Args:
        argv: the arguments after the program name: Hydra's flags, then the overrides.

    Returns:
        The problems, each a line without the ``config error:`` prefix.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, MissingConfigException

    from s2s import hydra_guard

    if problems := hydra_guard.check_flags(argv):
        return problems
    flags = [arg for arg in argv if not is_override(arg)]
    if any(flag.split("=", 1)[0] in OTHER_CONFIG_FLAGS for flag in flags):
        return []
    overrides = [arg for arg in argv if is_override(arg)]
    problems: list[str] = []
    if "-m" in flags or "--multirun" in flags:
        try:
            parsed = OverridesParser.create().parse_overrides(overrides)
        except Exception:  # a grammar error: Hydra's message names it
            return []
        overrides, problems = _as_first_job(parsed)
    try:
        compose(overrides)  # the guard refuses a disallowed target here, before Hydra's own composition
    except (MissingConfigException, ConfigCompositionException) as error:
        return problems + explain_refusal(compose, overrides, error)
    except Exception:  # grammar errors and the like: Hydra reports them in its own words
        return problems
    return problems
