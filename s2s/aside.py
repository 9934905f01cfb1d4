"""One call run beside the caller's own work, in a thread of its own, whose result the caller takes later."""
from __future__ import annotations

import threading
import time
from typing import Any


class Aside(threading.Thread):
    """``call(*args)`` in a daemon thread of its own, started at once; :meth:`result` waits for it and returns
    it (or raises its error). ``seconds`` is then the call's wall time (beside other work, on busy cores, it may
    be several times the call's time alone)."""

    def __init__(self, call: Any, *args: Any, name: str = "s2s-aside") -> None:
        super().__init__(name=name, daemon=True)
        self._call, self._args = call, args
        self._value: Any = None
        self._error: BaseException | None = None
        self.seconds = 0.0
        self.start()

    def run(self) -> None:
        start = time.perf_counter()
        try:
            self._value = self._call(*self._args)
        except BaseException as error:  # handed to the reader
            self._error = error
        finally:
            self.seconds = time.perf_counter() - start

    def result(self) -> Any:
        self.join()
        if self._error is not None:
            raise self._error
        return self._value
