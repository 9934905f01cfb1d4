"""s2s entry point: python run.py [group=option ...] [key=value ...] [-m for sweeps].

Adds platform=<detected> unless given, checks the command line (one line per problem, exit 2), then hands
over to Hydra.
"""
import sys

import hydra
from omegaconf import DictConfig

from s2s import app, cli, hydra_guard


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    code = app.main(cfg)
    if code and not app.in_multirun():
        sys.exit(code)  # a sweep keeps going: the failed job becomes a row of the summary
    return code


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *cli.prepare_argv(sys.argv[1:])]
    hydra_guard.install()  # before anything is composed: every config Hydra composes is checked
    if problems := cli.check(sys.argv[1:]):
        cli.fail(problems)
    main()
