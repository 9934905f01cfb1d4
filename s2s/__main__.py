"""``python -m s2s [local|serve|talk] [overrides]``: the ``s2s`` console command without its script."""
import sys

from s2s.entry import main

sys.exit(main())
