"""The CI examples under examples/ci/: each parses, and every gpurace command in it is one this
gpurace accepts (its subcommand, options and values are parsed by the real CLI, not run)."""

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
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)  # ${VAR:-default} -> default
    text = re.sub(r"\$\{?\w+\}?", "0", text)
    found = []
    for line in text.splitlines():
        line = line.strip().lstrip("-").strip()
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
