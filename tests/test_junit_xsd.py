"""JUnit XML that validates: gpurace's `run --junit` files, from real runs on the simulated device,
against the schema of pytest's xunit2 output (tests/schemas/junit-xunit2.xsd), which pytest's own
files must pass too; and real times in every testsuite and testcase."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from reports import render_junit

xmlschema = pytest.importorskip("xmlschema")

REPO = Path(__file__).resolve().parent.parent
XSD = Path(__file__).resolve().parent / "schemas" / "junit-xunit2.xsd"
SCENARIOS = REPO / "scenarios"


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(XSD))


def _junit(tmp_path: Path, *args: str) -> tuple[int, dict, ET.Element, Path]:
    """Run gpurace with --junit; its exit code, run document, JUnit root and JUnit file."""
    junit = tmp_path / "junit.xml"
    result = CliRunner().invoke(main, ["run", *args, "--backend", "sim", "--format", "json",
                                       "--out", str(tmp_path / "out"), "--junit", str(junit)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout), ET.parse(junit).getroot(), junit


def _strict_readers_read_it(root: ET.Element) -> None:
    """What the strictest readers want too: one system-out at most, after the result."""
    for case in root.iter("testcase"):
        tags = [child.tag for child in case]
        assert tags.count("system-out") <= 1 and "system-err" not in tags
        assert tags[-1:] == ["system-out"] or tags in ([], ["skipped"])


def _times_add_up(root: ET.Element, doc: dict) -> None:
    """Each testcase's time is its variant's wall_s; a suite's the sum of its cases', the run's
    the sum of its suites'."""
    walls = {(f"gpurace.{r['scenario']}", r["variant"]): r["wall_s"] for r in doc["results"]}
    total = 0.0
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        for case in cases:
            assert float(case.get("time")) == pytest.approx(
                walls[(case.get("classname"), case.get("name"))], abs=0.0005)
        assert float(suite.get("time")) == pytest.approx(
            sum(float(c.get("time")) for c in cases), abs=0.0005 * (len(cases) + 1))
        total += float(suite.get("time"))
    assert float(root.get("time")) == pytest.approx(total, abs=0.002)


@pytest.mark.parametrize("logging", ["no", "all"])
def test_pytests_own_xunit2_output_validates(schema: xmlschema.XMLSchema, tmp_path: Path,
                                             logging: str) -> None:
    """The schema is pytest's xunit2 structure: every kind of result pytest writes passes,
    with the captured output (junit_logging=all) and without."""
    (tmp_path / "test_tiny.py").write_text(
        "import sys\n"
        "import pytest\n\n"
        "def test_passes():\n    print('to stdout'); print('to stderr', file=sys.stderr)\n\n"
        "def test_fails():\n    assert 1 == 2\n\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_xfails():\n    assert False\n\n"
        "@pytest.mark.xfail(strict=True)\ndef test_xpasses_strictly():\n    pass\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('in setup')\n\n"
        "def test_errors(broken):\n    pass\n\n"
        "@pytest.fixture\ndef bad_teardown():\n    yield\n    raise RuntimeError('teardown')\n\n"
        "def test_fails_then_teardown_errors(bad_teardown):\n    assert 0\n\n"
        "def test_suite_property(record_testsuite_property):\n"
        "    record_testsuite_property('gpu', 'none')\n")
    xml = tmp_path / "pytest.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-o", "junit_family=xunit2", "-o", f"junit_logging={logging}",
                    f"--junitxml={xml}", "test_tiny.py"], cwd=tmp_path, capture_output=True,
                   check=False, timeout=120)
    schema.validate(str(xml))
    root = ET.parse(xml).getroot()
    tags = {element.tag for element in root.iter()}
    assert {"testsuites", "testsuite", "properties", "property", "testcase", "failure",
            "skipped", "error"} <= tags
    assert len(root.findall(".//testcase")) == 9
    assert ({"system-out", "system-err"} <= tags) == (logging == "all")


def test_the_schema_refuses_what_the_old_renderer_wrote(schema: xmlschema.XMLSchema) -> None:
    """What xunit1 allows and xunit2 does not: a testcase's file and its properties, and a
    skipped count on testsuites."""
    good = ('<testsuites name="gpurace" tests="1" failures="0" errors="0" time="0.100">'
            '<testsuite name="s" tests="1" skipped="0" time="0.100">{suite}'
            '<testcase classname="gpurace.s" name="v" time="0.100"{attr}>{case}</testcase>'
            '</testsuite></testsuites>')
    assert schema.is_valid(good.format(suite="", attr="", case=""))
    assert not schema.is_valid(good.format(suite="", attr=' file="s.yaml"', case=""))
    assert not schema.is_valid(good.format(
        suite="", attr="", case='<properties><property name="a" value="b"/></properties>'))
    assert not schema.is_valid(good.format(suite="", attr="", case="").replace(
        'errors="0" time', 'errors="0" skipped="0" time', 1))
    assert not schema.is_valid(good.format(suite="", attr=' time="-1"', case="").replace(
        ' time="0.100" time="-1"', ' time="-1"'))


def test_a_passing_run_validates_with_real_times(schema: xmlschema.XMLSchema,
                                                 tmp_path: Path) -> None:
    code, doc, root, junit = _junit(tmp_path, "smoke", "--trials", "3")
    assert code == 0
    schema.validate(str(junit))
    _strict_readers_read_it(root)
    assert all(r["wall_s"] > 0 for r in doc["results"])
    assert all(float(c.get("time")) > 0 for c in root.iter("testcase"))
    assert float(root.get("time")) > 0
    _times_add_up(root, doc)
    suite = root.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert props["path"].endswith("release_fence.yaml") and props["backend"] == "sim"
    assert props["run_id"] == doc["run_id"] and props["seed"] == "0"
    buggy = suite.find("testcase[@name='buggy']")
    out = buggy.findtext("system-out") or ""
    assert out.startswith("expect reproduces; 3 trials in ") and "race (in 3/3 trials): " \
                                                                 "nothing orders" in out
    assert out.count("incident: ") == len(doc["results"][0]["reports"]) == 3


def test_a_run_that_skips_validates(schema: xmlschema.XMLSchema, tmp_path: Path) -> None:
    # Two trials in all, at places 0 and 1: shard 3 of 3 has none of them.
    code, doc, root, junit = _junit(tmp_path, "cross-stream-race", "--trials", "1",
                                    "--shard", "3/3")
    assert code == 77
    schema.validate(str(junit))
    _strict_readers_read_it(root)
    suite = root.find("testsuite")
    assert suite.get("skipped") == "2" and root.get("skipped") is None
    assert [c.find("skipped").get("message") for c in suite.iter("testcase")] == [
        r["reason"] for r in doc["results"]]
    assert root.get("time") == "0.000"  # nothing ran


def test_a_run_that_fails_validates(schema: xmlschema.XMLSchema, tmp_path: Path) -> None:
    code, doc, root, junit = _junit(tmp_path, "cross-stream-race", "--no-amplify",
                                    "--no-detect", "--variant", "buggy", "--dangerous",
                                    "--trials", "5")
    assert code == 1
    schema.validate(str(junit))
    _times_add_up(root, doc)
    _strict_readers_read_it(root)
    failure = root.find(".//testcase/failure")
    assert failure.get("type") == "reproduces"
    assert failure.get("message").startswith("expected reproduces; clean 5 of 5 trials")
    assert "outcomes: clean 5 of 5 trials" in failure.text
    assert root.get("failures") == "1" and float(root.get("time")) > 0


def test_a_failure_tells_the_race_and_the_incidents(schema: xmlschema.XMLSchema,
                                                    tmp_path: Path) -> None:
    """A "fixed" variant that still has the bug: its failure names the outcome counts, the
    first trial, the race with its fix, and each incident folder."""
    text = (SCENARIOS / "release_fence.yaml").read_text()
    assert "fixed: {expect: clean}" in text
    broken = tmp_path / "broken_fix.yaml"
    broken.write_text(text.replace("fixed: {expect: clean}",
                                   "fixed: {defects: {release_fence: false}, expect: clean}"))
    code, doc, root, junit = _junit(tmp_path, str(broken), "--variant", "fixed", "--trials", "4",
                                    "--max-incidents", "2")
    assert code == 1
    schema.validate(str(junit))
    failure = root.find(".//testcase/failure")
    lines = failure.text.splitlines()
    result = doc["results"][0]
    assert lines[0] == result["reason"]
    assert "outcomes: corruption 4 of 4 trials" in lines
    assert any(line.startswith("first manifested: trial 0 (seed ") for line in lines)
    race = next(line for line in lines if line.startswith("race (in 4/4 trials): "))
    assert race.endswith(result["findings"][0]["missing"])
    assert [line.removeprefix("incident: ") for line in lines
            if line.startswith("incident: ")] == result["reports"]
    assert len(result["reports"]) == 2


def test_odd_run_documents_still_validate(schema: xmlschema.XMLSchema) -> None:
    """Whatever a producer left out or got wrong, the file stays valid JUnit."""
    odd = {"results": [
        {"scenario": "s", "variant": "v", "status": "exploded"},
        {"scenario": "s", "variant": "w", "status": "fail", "wall_s": float("nan"),
         "findings": [{"missing": "nothing orders a before b", "first": "?"}]},
        {"scenario": "t", "variant": "v", "status": "pass", "wall_s": -3, "sweep": True,
         "delay_us": 20.0, "xids": [{"xid": 43, "class": "application", "trials": 2}, 79]},
        {"scenario": "t", "variant": "x", "status": "skip", "wall_s": "soon"},
        "not a result"]}
    for document in (odd, {}, {"results": []}, {"results": None, "device": "a string"}):
        xml = render_junit(document)
        schema.validate(xml.split("\n", 1)[1])
    root = ET.fromstring(render_junit(odd).split("\n", 1)[1])
    assert (root.get("tests"), root.get("errors"), root.get("failures"), root.get("time")) == (
        "4", "1", "1", "0.000")
