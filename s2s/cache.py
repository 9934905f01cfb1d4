"""Old home of the build-once cache, kept so existing imports work: it lives in :mod:`s2s.models` now."""
from s2s.models import build_once, cache_root

__all__ = ["build_once", "cache_root"]
