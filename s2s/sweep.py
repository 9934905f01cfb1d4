"""Hydra callback for sweeps (``python run.py -m ...``): fair per-job measurements and a summary at the end.

Registered under ``hydra.callbacks`` in conf/config.yaml; Hydra builds it and calls it in the launching
process (``on_multirun_*``) and wherever a job runs (``on_job_*``: the same process for the basic launcher,
a loky worker for joblib, a Ray worker, a Slurm node for submitit).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from s2s.platform import reset_peak_memory

log = logging.getLogger("s2s.sweep")

# thread-pool sizes of OpenMP/BLAS libraries; joblib's loky workers get cores // n_jobs, Ray workers num_cpus
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")
_jobs_in_process = 0  # launchers reuse worker processes: how many jobs this one ran before


def limit_threads() -> int | None:
    """Apply the launcher's per-worker thread budget (``OMP_NUM_THREADS``) to every library in this process.

    joblib gives each loky worker ``cores // n_jobs`` threads and Ray gives a worker its ``num_cpus`` through
    that variable; libraries imported later read it, but torch may already be loaded from an earlier job in a
    reused worker, so it is told directly.
    """
    value = os.environ.get("OMP_NUM_THREADS", "")
    if not value.isdigit() or int(value) < 1:
        return None
    for name in THREAD_VARS:
        os.environ.setdefault(name, value)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(value))
    return int(value)


def _multirun(config: DictConfig) -> bool:
    return config.hydra.mode == RunMode.MULTIRUN


class SweepCallback(Callback):
    """Makes sweep jobs comparable and summarises them.

    Per job (multirun only): limits thread pools to the launcher's budget, resets the peak-memory count of a
    reused process, and leaves ``sweep_job.json`` (process, threads, an exception Hydra caught) beside
    ``metrics.json``. At the end of the sweep: ``summary.csv``, ``summary.md`` and ``summary.png`` in the
    sweep folder (see :mod:`s2s.report`).

    Args:
        report: write the summary when the sweep ends.
    """

    def __init__(self, report: bool = True) -> None:
        self.report = report
        self._peak_reset = False
        self._threads: int | None = None
        self._jobs_before = 0

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _jobs_in_process
        if not _multirun(config):
            return
        self._threads = limit_threads()
        self._peak_reset = reset_peak_memory()
        self._jobs_before = _jobs_in_process
        _jobs_in_process += 1

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not _multirun(config):
            return
        facts: dict[str, Any] = {"num": config.hydra.job.num, "pid": os.getpid(),
                                 "launcher": str(config.hydra.launcher.get("_target_", "")).rsplit(".", 1)[-1],
                                 "jobs_before_in_process": self._jobs_before,
                                 "peak_memory_reset": self._peak_reset, "threads": self._threads,
                                 "torch_threads": sys.modules["torch"].get_num_threads()
                                 if "torch" in sys.modules else None,
                                 "hydra_status": job_return.status.name, "dry_run": bool(config.get("dry_run")),
                                 "error": None}
        if job_return.status == JobStatus.FAILED:  # job.run returns codes; this is an unexpected exception
            error = job_return._return_value  # the public property re-raises it
            facts["error"] = f"{type(error).__name__}: {error}"
            log.error("job %s raised %s; once the sweep stops, rebuild its summary with: python -m s2s.report %s",
                      config.hydra.job.num, facts["error"], config.hydra.sweep.dir)
        output_dir = Path(config.hydra.runtime.output_dir)
        (output_dir / "sweep_job.json").write_text(json.dumps(facts, indent=2))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.report:
            return
        from s2s.report import write_report

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            paths = write_report(sweep_dir)
        except Exception as error:  # a broken report must not turn a finished sweep into a failure
            log.error("sweep summary failed (%s: %s); retry with: python -m s2s.report %s",
                      type(error).__name__, error, sweep_dir)
            return
        log.info("sweep summary: %s (table), %s (plot)", paths["summary.md"], paths["summary.png"])
