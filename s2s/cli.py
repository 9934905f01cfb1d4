"""Command-line front: platform detection and clear errors for overrides Hydra cannot compose.

Hydra reports an unknown group option or key with a multi-line message and exit code 1; s2s promises one line
per problem (what was given, what would be valid) and exit code 2, before anything else happens.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from s2s.platform import detect

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
_HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                           "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra flags with their values, overrides)."""
    flags, overrides, index = [], [], 0
    while index < len(argv):
        arg = argv[index]
        if arg in _HYDRA_FLAGS_WITH_VALUE and index + 1 < len(argv) and not argv[index + 1].startswith("-") \
                and "=" not in argv[index + 1]:
            flags += argv[index:index + 2]
            index += 2
            continue
        (flags if arg.startswith("-") else overrides).append(arg)
        index += 1
    return flags, overrides


def group_options(group: str) -> list[str]:
    """User-facing options of a config group (files starting with '_' are bases)."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml") if not path.name.startswith("_"))


def config_groups() -> list[str]:
    return sorted(path.name for path in CONF_DIR.iterdir() if path.is_dir() and not path.name.startswith("_"))


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def preflight(overrides: list[str]) -> list[str]:
    """Compose once to catch unknown options and keys; one message per bad override (empty when fine)."""
    problems: list[str] = []
    remaining = [o for o in overrides if not _override_key(o).startswith("hydra")]
    for _ in range(len(remaining) + 1):
        try:
            with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
                compose("config", overrides=remaining)
            return problems
        except (MissingConfigException, ConfigCompositionException) as error:
            culprit = _culprit(str(error), remaining)
            if culprit is None:
                return problems + [str(error).strip().splitlines()[0]]
            problems.append(_explain(culprit, remaining))
            remaining.remove(culprit)
        except Exception as error:  # grammar errors and the like: Hydra's first line says it well
            return problems + [str(error).strip().splitlines()[0]]
    return problems


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


def _explain(override: str, others: list[str]) -> str:
    key, _, value = override.partition("=")
    bare = key.lstrip("+~")
    if "." not in bare and (CONF_DIR / bare).is_dir():
        return f"{bare}={value}: unknown option for config group '{bare}'; valid: {', '.join(group_options(bare))}"
    if "." not in bare:
        return f"{bare}={value}: unknown key; config groups are: {', '.join(config_groups())}"
    parent, _, leaf = bare.rpartition(".")
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[o for o in others if o != override])
        node = OmegaConf.select(cfg, parent)
        valid = ", ".join(str(k) for k in node.keys() if k != "_target_") if isinstance(node, DictConfig) else "?"
    except Exception:  # a second failure only loses the hint
        valid = "?"
    return f"{bare}={value}: unknown key '{leaf}' in '{parent}'; valid keys: {valid}"


def prepare_argv(argv: list[str]) -> list[str]:
    """Append ``platform=<detected>`` unless the user chose one; exit 2 on overrides that cannot compose."""
    flags, overrides = split_argv(argv)
    if not any(_override_key(o) == "platform" for o in overrides):
        overrides = [*overrides, f"platform={detect().platform}"]
    argv = [*flags, *overrides]  # flags first: argparse refuses overrides on both sides of `--cfg job`
    multirun = "-m" in flags or "--multirun" in flags
    if not multirun and not {"--help", "-h", "--hydra-help", "--shell-completion", "-sc"} & set(flags):
        problems = preflight(overrides)
        if problems:
            for problem in problems:
                print(f"config error: {problem}", file=sys.stderr)
            raise SystemExit(2)
    return argv
