"""The CI examples under examples/ci/: each parses, and every gpurace command in it (comments
too) is one this gpurace accepts (its subcommand, options and values are parsed by the real CLI,
not run); the sharded ones give every shard of 1..N exactly once, as the shell works it out."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import yaml

from harness.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "ci"


def _commands(text: str) -> list[list[str]]:
    """The gpurace command lines of a script, shell variables given sample values."""
    text = text.replace("\\\n", " ")
    text = re.sub(r"\$\(\((.*?)\)\)", "1", text)  # shell arithmetic -> 1
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)  # ${VAR:-default} -> default
    text = re.sub(r"\$\{?\w+\}?", "1", text)
    found = []
    for line in text.splitlines():
        # A command shown in a comment is indented there, as in "#   gpurace merge ...".
        line = re.sub(r"^#\s{2,}(?=gpurace )", "", line.strip()).lstrip("-").strip()
        if line.startswith("gpurace "):
            found.append(shlex.split(line)[1:])
    return found


def _parse(args: list[str]) -> None:
    """Parse ``gpurace ARGS`` with the real CLI, without running the command."""
    ctx = click.Context(main, info_name="gpurace")
    name, *rest = args
    command = main.get_command(ctx, name)
    assert command is not None, f"no command {name}"
    command.make_context(name, rest, parent=ctx)


@pytest.mark.parametrize("path", sorted(EXAMPLES.iterdir()), ids=lambda p: p.name)
def test_every_example_parses_and_its_commands_are_real(path: Path) -> None:
    text = path.read_text()
    if path.suffix in (".yml", ".yaml"):
        assert isinstance(yaml.safe_load(text), dict)
    else:
        assert text.startswith("#!/bin/bash") and "#SBATCH" in text
    commands = _commands(text)
    assert any(c[0] == "run" for c in commands), "every example runs something"
    for args in commands:
        try:
            _parse(args)
        except click.ClickException as exc:  # pragma: no cover - the failure message
            pytest.fail(f"{path.name}: gpurace {shlex.join(args)}: {exc.format_message()}")


def test_a_wrong_option_would_be_caught() -> None:
    with pytest.raises(click.NoSuchOption):
        _parse(["run", "smoke", "--no-such-option"])


def _shards(path: Path) -> tuple[int, str, str]:
    """How many shards an example runs, the shell word of its --shard, and the variable that
    numbers its tasks: a Slurm array's --array=1-N, or an Indexed Job's completions."""
    text = path.read_text()
    word = re.search(r'--shard "([^"]+)"', text)
    assert word, f"{path.name} runs no --shard"
    if path.suffix == ".yaml":
        job = yaml.safe_load(text)["spec"]
        assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"]
        env = {e["name"]: e["value"] for e in
               job["template"]["spec"]["containers"][0]["env"]}
        assert env["SHARDS"] == str(job["completions"]), "SHARDS must equal completions"
        return job["completions"], word.group(1), "JOB_COMPLETION_INDEX"
    array = re.search(r"^#SBATCH --array=1-(\d+)$", text, re.M)
    assert array, f"{path.name}: a sharded array numbers its tasks from 1"
    return int(array.group(1)), word.group(1), "SLURM_ARRAY_TASK_ID"


@pytest.mark.parametrize("name", ["slurm-shards.sbatch", "k8s-indexed-job.yaml"])
def test_sharded_examples_run_every_shard_once(name: str) -> None:
    """Each task's --shard, worked out by bash with the variables the scheduler sets."""
    import subprocess

    path = EXAMPLES / name
    n, word, numbered = _shards(path)
    first = 0 if numbered == "JOB_COMPLETION_INDEX" else 1  # Kubernetes counts from 0
    shards = []
    for task in range(first, first + n):
        env = {numbered: str(task), "SLURM_ARRAY_TASK_COUNT": str(n), "SHARDS": str(n),
               "PATH": "/usr/bin:/bin"}
        shards.append(subprocess.run(["bash", "-c", f'echo "{word}"'], env=env, check=True,
                                     capture_output=True, text=True).stdout.strip())
    assert shards == [f"{k}/{n}" for k in range(1, n + 1)]
