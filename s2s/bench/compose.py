"""The benchmarks' configs: composed as the command line composes them (platform detected, overrides applied)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def composed(overrides: list[str], output_dir: Path | str) -> Any:
    """``conf/config.yaml`` with ``overrides`` and ``output_dir``, as ``python run.py`` would compose it."""
    from hydra import compose, initialize_config_dir

    from s2s.cli import CONF_DIR, prepare_argv

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=prepare_argv([*overrides, f"output_dir={output_dir}"]))


def stage_spec(cfg: Any, group: str) -> Any:
    """The validated spec of ``group``'s stage (the whole config is validated, as a run would)."""
    from s2s.config import validate

    return next(spec for spec in validate(cfg) if spec.group == group)


def set_up(overrides: list[str], group: str, output_dir: Path | str) -> Any:
    """``group``'s stage of the composed config, built, set up and warmed up: the benchmark times only it."""
    stage = stage_spec(composed(overrides, output_dir), group).build()
    stage.setup()
    stage.warm_up()
    return stage
