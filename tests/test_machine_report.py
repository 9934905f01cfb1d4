"""What a benchmark and a metrics file say about the machine: the CPU, its cores and the library CTranslate2 runs
its int8 products with (MKL on Intel CPUs, oneDNN elsewhere on x86: about twice as slow for the decoders)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from conftest import ROOT

ASK = "import sys; {imports}from s2s.platform import ctranslate2_int8, cpu_description, machine_info; " \
      "print(ctranslate2_int8()); print(cpu_description()); print(machine_info()['ctranslate2_int8'])"


def asked(imports: str, **env: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", ASK.format(imports=imports)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=True)
    return done.stdout.splitlines()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="MKL and oneDNN are x86's")
@pytest.mark.parametrize(("use_mkl", "library"), [("1", "MKL"), ("0", "oneDNN")])
def test_the_report_names_the_int8_library_ctranslate2_chose(use_mkl, library):
    said, described, recorded = asked("import ctranslate2; ", CT2_USE_MKL=use_mkl)
    assert said == recorded == library
    assert described.endswith(f" cores, CTranslate2 int8 through {library}")


def test_a_process_that_never_loaded_ctranslate2_reports_no_library_and_does_not_import_it():
    said, described, recorded = asked("", CT2_USE_MKL="0")
    assert said == recorded == "None" and described.endswith(" cores")


def test_without_the_variable_the_library_follows_the_cpu_vendor():
    """CTranslate2's own rule: MKL where the CPU says GenuineIntel, and not elsewhere."""
    try:
        vendor = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("vendor_id"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo vendor here")
    environment = {key: value for key, value in os.environ.items() if key != "CT2_USE_MKL"}
    done = subprocess.run([sys.executable, "-c", ASK.format(imports="import ctranslate2; ")], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env={**environment, "PYTHONPATH": str(ROOT)}, check=True)
    assert done.stdout.splitlines()[0] == ("MKL" if vendor == "GenuineIntel" else "oneDNN")
