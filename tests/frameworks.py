"""Which interpreter the capture's CPU tests run programs with: one that imports the framework
they watch (test modules import this as ``tests.frameworks``; a conftest's module name is
shared with the watch programs' own)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys


@functools.cache
def python_with(module: str) -> str | None:
    """An interpreter that imports ``module``: this one, or GPURACE_TEST_PYTHON (PyTorch for the
    CPU, with its Triton, serves the capture's CPU tests: they need a framework to import, not
    a GPU); None where neither does (CI)."""
    for python in (sys.executable, os.environ.get("GPURACE_TEST_PYTHON")):
        if python and subprocess.run([python, "-c", f"import {module}"],
                                     capture_output=True).returncode == 0:
            return python
    return None
