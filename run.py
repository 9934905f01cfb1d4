"""s2s entry point: python run.py [group=option ...] [key=value ...] [-m for sweeps].

The same as the ``s2s`` command and ``python -m s2s`` (s2s/entry.py, where Hydra's main is written once):
adds platform=<detected> unless given, checks the command line (one line per problem, exit 2), then hands
over to Hydra.
"""
import sys

from s2s import entry

if __name__ == "__main__":
    sys.exit(entry.main())
