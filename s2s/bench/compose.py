"""The benchmarks' configs: composed as the command line composes them (platform detected, overrides applied)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def composed(overrides: list[str], output_dir: Path | str) -> Any:
    """``conf/config.yaml`` with ``overrides`` and ``output_dir``, as ``python run.py`` would compose it."""
    from s2s.compose import compose, prepare_argv

    return compose(prepare_argv(overrides), output_dir, hydra_node=False)


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
