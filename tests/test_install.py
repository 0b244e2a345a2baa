"""`make run`'s environment holds what the main job needs and nothing of the tests' (#29: it
installed the dev extra, Ray and matplotlib included: 487 MB and 49 s before the first smoke run
on this machine's kind; 115 MB and 20 s once it installed gpurace alone)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEV_ONLY = {"pytest", "hypothesis", "jsonschema", "xmlschema", "ray", "matplotlib", "wheel"}
NEEDED = {"gpurace", "click", "rich", "pyyaml", "nvidia-ml-py", "numpy"}


def test_make_runs_environment_holds_gpurace_and_its_dependencies_only(tmp_path):
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    made = subprocess.run(["make", "-C", str(ROOT), "install", f"VENV={venv}"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format",
                             "json"], capture_output=True, text=True, check=True).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert NEEDED <= names, NEEDED - names
    assert not names & DEV_ONLY, names & DEV_ONLY
    version = subprocess.run([str(venv / "bin" / "gpurace"), "--version"], capture_output=True,
                             text=True, env=env)
    assert version.returncode == 0 and "version" in version.stdout
