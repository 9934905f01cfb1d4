"""s2s.platform.fix_allocator: freed models go back to the system, and a model's per-call buffers stay mapped."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

# In a fresh process: fix the allocator, then allocate, touch and free a 4 MiB block (under the 8 MiB mmap
# threshold, so it comes from the heap's top) 40 times. Prints the minor page faults the loop took, then the free
# bytes the heap kept after the last free (glibc's mallinfo2).
LOOP = """
import ctypes, resource, sys
import numpy as np
from s2s.platform import fix_allocator
print(fix_allocator(), file=sys.stderr)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
np.ones(1 << 19).sum()  # the first block: its pages are faulted in once
before = faults()
for _ in range(40):
    block = np.ones(1 << 19)  # 4 MiB, every page written
    del block
print(faults() - before, libc.mallinfo2().fordblks)
"""
PAGES = (4 << 20) // 4096  # a 4 MiB block's pages (fewer faults where the kernel gives it huge pages)


def freed_block(**env: str) -> tuple[int, int]:
    """The loop's page faults, and the free bytes its heap kept, with ``env`` set (any MALLOC_ one taken out)."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    result = subprocess.run([sys.executable, "-c", LOOP], cwd=ROOT, env={**environment, **env}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "True", result.stderr  # the mmap threshold was set (glibc)
    faults, kept = result.stdout.split()
    return int(faults), int(kept)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_freed_block_at_the_heaps_top_stays_mapped_for_the_next_call():
    """A fixed mmap threshold stops glibc moving the trim threshold with it; left at 128 KiB, every free at the
    heap's top gave the pages back and the next call faulted them in again (0.04 s of Whisper's pass a turn).
    fix_allocator sets it as glibc would (twice the mmap threshold); a user's own setting is left alone."""
    faults, kept = freed_block()
    assert faults < PAGES and kept >= 4 << 20  # the 40 blocks reuse the first one's pages (measured: no fault)
    faults, kept = freed_block(MALLOC_TRIM_THRESHOLD_="131072")  # glibc's default, as before the fix
    assert kept < 1 << 20  # given back at each free (measured: the faults of about 19 blocks, huge pages aside)
