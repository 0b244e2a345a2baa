"""The README is a user's guide that stays true: short enough to read, its links lead somewhere,
and the scenario it teaches with runs as it says."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from harness.cli import main

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
README_MAX_LINES = 400  # a guide a new user reads through; the details live in docs/


def test_the_readme_is_a_guide_of_at_most_400_lines() -> None:
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move details to docs/"


def test_every_link_of_the_readme_and_the_docs_leads_to_a_file() -> None:
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_the_readmes_scenario_reproduces_buggy_and_stays_clean_fixed(tmp_path: Path) -> None:
    """The ten-line scenario under "Scenarios", saved and run as the README says, on the
    simulated device: the buggy variant manifests in every trial and the detector finds the
    race, the fixed variant neither."""
    section = README[README.index("## Scenarios"):]
    scenario = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert scenario, "the Scenarios section has no yaml block"
    path = tmp_path / "forgot_the_wait.yaml"
    path.write_text(scenario.group(1))
    result = CliRunner().invoke(main, ["run", str(path), "--trials", "20", "--backend", "sim",
                                       "--format", "json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    variants = {r["variant"]: r for r in json.loads(result.stdout)["results"]}
    assert variants["buggy"]["manifested"] == 20 and variants["buggy"]["detected"] == 20
    assert variants["fixed"]["manifested"] == 0 and variants["fixed"]["detected"] == 0
