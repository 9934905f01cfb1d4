"""python -m s2s.bench startup [--rounds N]: ``s2s --cfg job`` against a bare ``@hydra.main`` app, paired.

Both compose the same conf/ (the bare app with the platform given, as s2s adds it) and print the job config;
the two commands take turns, so a busy machine slows both alike. The ratio of the medians is the figure.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE_APP = '''import hydra

@hydra.main(config_path={conf!r}, config_name="config", version_base="1.3")
def main(cfg):
    pass

if __name__ == "__main__":
    main()
'''


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - start


def bench_startup(rounds: int) -> int:
    from s2s.compose import CONF_DIR
    from s2s.platform import detect

    platform = f"platform={detect().platform}"
    with tempfile.TemporaryDirectory() as folder:
        bare = Path(folder) / "bare_app.py"
        bare.write_text(BARE_APP.format(conf=str(CONF_DIR)))
        commands = {"s2s --cfg job": [sys.executable, "-m", "s2s", "--cfg", "job"],
                    "bare @hydra.main --cfg job": [sys.executable, str(bare), "--cfg", "job", platform]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for name, command in commands.items():  # one unmeasured run each: disk caches warm for both
            _seconds(command)
        for _ in range(rounds):
            for name, command in commands.items():
                times[name].append(_seconds(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name:28s} median {median:.3f} s (min {min(times[name]):.3f}, max {max(times[name]):.3f}) "
              f"over {rounds} rounds")
    print(f"ratio s2s / bare: {medians['s2s --cfg job'] / medians['bare @hydra.main --cfg job']:.2f}x "
          f"(paired, interleaved)")
    return 0
