"""Which interpreter the capture's CPU tests run programs with: one that imports the framework
they watch (test modules import this as ``tests.frameworks``; a conftest's module name is
shared with the watch programs' own)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_printing_json(python: str, program: str, folder: Path, *args: str) -> tuple[Any, str]:
    """Run ``program`` (its text) with ``python`` in ``folder``, gpurace on its path; what it
    printed as JSON, and its standard error. Its exit must be 0."""
    path = folder / "prog.py"
    path.write_text(program)
    done = subprocess.run([python, str(path), *args], capture_output=True, text=True,
                          cwd=folder, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout), done.stderr
