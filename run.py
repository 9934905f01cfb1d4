"""s2s entry point: python run.py [group=option ...] [key=value ...] [-m for sweeps].

Adds platform=<detected> unless given, then hands over to Hydra, which composes the config once.
"""
import sys

import hydra
from omegaconf import DictConfig

from s2s import app, cli


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    code = app.main(cfg)
    if code and not app.in_multirun():
        sys.exit(code)  # a sweep keeps going: the failed job becomes a row of the summary
    return code


if __name__ == "__main__":
    cli.install()
    sys.argv = [sys.argv[0], *cli.prepare_argv(sys.argv[1:])]
    main()
