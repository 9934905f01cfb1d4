"""Composing s2s's configs: where they are, the platform added to a command line, and the compose helper.

The one place s2s composes a config outside ``@hydra.main`` (benchmarks, Ray Serve's builder, the command-line
check) and finds its config groups.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from s2s.platform import detect

# The configs: inside an installed wheel (s2s/conf, mapped from conf/ at build time), else the checkout's conf/.
_PACKAGED_CONF = Path(__file__).resolve().parent / "conf"
CONF_DIR = _PACKAGED_CONF if (_PACKAGED_CONF / "config.yaml").is_file() else Path(__file__).resolve().parent.parent / "conf"


def group_options(group: str) -> list[str]:
    """User-facing options of a config group (files starting with '_' are bases)."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml") if not path.name.startswith("_"))


def config_groups() -> list[str]:
    """Groups a user selects (``hydra`` is Hydra's own; ``*_platform`` are applied automatically)."""
    return sorted(path.name for path in CONF_DIR.iterdir() if path.is_dir() and not path.name.startswith("_")
                  and path.name != "hydra" and not path.name.endswith("_platform"))


def is_override(arg: str) -> bool:
    return not arg.startswith("-") and ("=" in arg or arg.startswith("~"))


def prepare_argv(argv: list[str]) -> list[str]:
    """Flags first, then the overrides, with ``platform=<detected>`` added unless the user chose one.

    Hydra takes the overrides as one run of positional arguments after its flags; moving every argument that
    is not an override (flags and their values, in their order) in front lets ``--cfg job`` or ``-m`` stand
    anywhere on the line.
    """
    flags = [arg for arg in argv if not is_override(arg)]
    overrides = [arg for arg in argv if is_override(arg)]
    if not any(arg.lstrip("+~").split("=", 1)[0] == "platform" for arg in overrides):
        overrides.append(f"platform={detect().platform}")
    return [*flags, *overrides]


def compose(overrides: list[str], output_dir: Path | str | None = None, *, hydra_node: bool = True) -> DictConfig:
    """conf/config.yaml with ``overrides`` as Hydra's public compose API makes it: the one place s2s composes.

    Args:
        overrides: the command line's overrides (:func:`prepare_argv` adds the platform).
        output_dir: the run folder, when the caller runs stages outside ``@hydra.main`` (benchmarks, Serve).
        hydra_node: keep the ``hydra`` node (what the command line checks; a config that runs stages has no use
            for it).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides = [*overrides, f"output_dir={output_dir}"] if output_dir is not None else list(overrides)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=overrides, return_hydra_config=hydra_node)
