"""Host threads in step scenarios, on the simulated device: parallel sections, handoffs,
mutexes, deadlocks, the held thread of amplification, and exploration of interleavings with
tokens that replay them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import ScenarioError
from harness.analyses.explore import Strategy, explore
from harness.lang.scenario import load_scenario
from kvcore.device.schedule import Schedule

HEAD = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: threads}
spec:
  pool: {pages: 4, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  streams: {s: non-blocking, t: non-blocking}
  trials: 20
  variants:
    buggy: {expect: reproduces}
    fixed: {expect: clean}
"""

# The other task is written first: its thread goes first unless something switches threads, so
# the default interleaving is clean and only a preemption (or the seed) shows the race.
REUSE = HEAD + """\
  steps:
    - {id: dst, op: materialize, pages: 1}
    - {op: host_fill, buffer: want, byte: 0xA1}
    - {id: other-alloc, op: host_alloc, buffer: other, thread: other}
    - {id: other-fill, op: host_fill, buffer: other, byte: 0xB2, thread: other}
    - {id: staging, op: host_alloc, buffer: staging, thread: task}
    - {op: host_fill, buffer: staging, byte: 0xA1, thread: task}
    - {id: copy, op: copy_from_host, src: staging, dst: dst, stream: s, thread: task}
    - {op: synchronize, stream: s, only: fixed, thread: task}
    - {op: host_free, buffer: staging, thread: task}
    - {op: synchronize}
    - {op: check, lease: dst, equals: want}
"""

DEADLOCK = HEAD.replace("buggy: {expect: reproduces}", "buggy: {expect: hang}") + """\
  steps:
    - {op: lock, mutex: a, thread: t1}
    - {op: lock, mutex: b, thread: t1}
    - {op: unlock, mutex: b, thread: t1}
    - {op: unlock, mutex: a, thread: t1}
    - {op: lock, mutex: b, thread: t2, only: buggy}
    - {op: lock, mutex: a, thread: t2, only: buggy}
    - {op: unlock, mutex: a, thread: t2, only: buggy}
    - {op: unlock, mutex: b, thread: t2, only: buggy}
    - {op: lock, mutex: a, thread: t2, only: fixed}
    - {op: lock, mutex: b, thread: t2, only: fixed}
    - {op: unlock, mutex: b, thread: t2, only: fixed}
    - {op: unlock, mutex: a, thread: t2, only: fixed}
    - {op: synchronize}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "threads.yaml"
    path.write_text(text)
    return path


def _run(path: Path, tmp_path: Path, *args: str) -> dict[str, dict]:
    result = CliRunner().invoke(main, ["run", str(path), "--backend", "sim", "--format", "json",
                                       "--out", str(tmp_path / "out"), *args])
    assert result.exit_code in (0, 1), result.output
    return {r["variant"]: r for r in json.loads(result.stdout)["results"]}


def test_sections_keep_each_threads_order_and_name_their_threads(tmp_path: Path) -> None:
    scenario = load_scenario(_write(tmp_path, REUSE))
    from harness.run.steps import sections

    parts = sections(scenario.steps_of("buggy"))
    assert [len(p.threads) for p in parts] == [0, 2, 0]
    assert [name for name, _ in parts[1].threads] == ["other", "task"]
    assert [s.op for s in dict(parts[1].threads)["task"]] == [
        "host_alloc", "host_fill", "copy_from_host", "host_free"]


def test_explore_finds_the_interleaving_and_its_token_replays_it(tmp_path: Path) -> None:
    """The default order (the other task first) is clean; a preemption to the task at the first
    decision runs its free before the other allocation, and with the copy held back on its
    stream (a thread switch alone gives a small copy time to land) the other task's bytes reach
    the device. The fixed variant (the copy waits for its stream before the free) has no failing
    schedule within the bound."""
    scenario = load_scenario(_write(tmp_path, REUSE))
    found = explore(scenario, scenario.variant("buggy"), Strategy.EXHAUSTIVE, bound=2)
    assert found.decisions >= 1 and found.failing
    assert found.failing[0].token != "s1-"  # not the default order
    switches = [t for t in found.failing if Schedule.parse(t.token).preempt]
    assert switches and "found 0xB2" in switches[0].detail
    fixed = explore(scenario, scenario.variant("fixed"), Strategy.EXHAUSTIVE, bound=2)
    assert fixed.failing == [] and fixed.tried > 10
    replayed = _run(_write(tmp_path, REUSE), tmp_path, "--variant", "buggy", "--schedule",
                    switches[0].token, "--trials", "5")
    assert replayed["buggy"]["outcomes"]["corruption"] == 5
    clean = _run(_write(tmp_path, REUSE), tmp_path, "--variant", "buggy", "--schedule", "s1-",
                 "--trials", "5")
    assert clean["buggy"]["outcomes"]["clean"] == 5


def test_the_seed_picks_interleavings_and_hold_forces_the_window(tmp_path: Path) -> None:
    """As real threads under CPython, a seeded run keeps the declared order but for a rare
    preemption: the free comes before the other allocation in a few trials (the race is found
    there), and a thread switch lets the small copy land first, so nothing manifests."""
    path = _write(tmp_path, REUSE)
    plain = _run(path, tmp_path, "--trials", "300")
    assert 0 < plain["buggy"]["detected"] <= 15 and plain["buggy"]["manifested"] == 0
    assert plain["fixed"]["manifested"] == 0 and plain["fixed"]["detected"] == 0
    again = _run(path, tmp_path, "--trials", "300")
    assert again["buggy"]["detected"] == plain["buggy"]["detected"]  # the seed decides
    held = _write(tmp_path, REUSE.replace(
        "  steps:", "  amplify: {delay_us: 1000, before: copy, hold: other-alloc}\n  steps:"))
    amplified = _run(held, tmp_path, "--trials", "40")
    assert amplified["buggy"]["manifested"] == 40 and amplified["fixed"]["manifested"] == 0
    unamplified = _run(held, tmp_path, "--trials", "300", "--no-amplify")
    assert unamplified["buggy"]["detected"] == plain["buggy"]["detected"]


def test_a_deadlock_is_a_hang_that_names_who_waits_for_what(tmp_path: Path) -> None:
    scenario = load_scenario(_write(tmp_path, DEADLOCK))
    found = explore(scenario, scenario.variant("buggy"), Strategy.EXHAUSTIVE, bound=1)
    [first, *_] = found.failing
    assert first.outcome.value == "hang"
    assert first.detail == (
        "the host threads deadlocked: thread t1 waits at 1:lock for mutex b (held by thread "
        "t2); thread t2 waits at 5:lock for mutex a (held by thread t1)")
    assert explore(scenario, scenario.variant("fixed"), Strategy.EXHAUSTIVE,
                   bound=2).failing == []
    replayed = _run(_write(tmp_path, DEADLOCK), tmp_path, "--variant", "buggy", "--schedule",
                    first.token, "--trials", "3")
    assert replayed["buggy"]["outcomes"]["hang"] == 3 and replayed["buggy"]["status"] == "pass"


def test_a_thread_waits_for_what_another_makes(tmp_path: Path) -> None:
    """A handoff: the consumer waits for an event the producer records behind its write; the
    wait waits until the producer has recorded it, whatever the interleaving."""
    text = HEAD.replace("buggy: {expect: reproduces}\n", "") + """\
  steps:
    - {op: host_fill, buffer: data, byte: 0x5A}
    - {id: made, op: materialize, pages: 1, thread: producer}
    - {op: copy_from_host, src: data, dst: made, stream: s, thread: producer}
    - {op: record_event, event: written, stream: s, thread: producer}
    - {op: wait_event, event: written, stream: t, thread: consumer}
    - {op: copy_to_host, src: made, dst: back, stream: t, thread: consumer}
    - {op: synchronize}
    - {op: check, buffer: back, equals: data}
"""
    path = _write(tmp_path, text)
    assert _run(path, tmp_path, "--trials", "30")["fixed"]["outcomes"]["clean"] == 30
    scenario = load_scenario(path)
    assert explore(scenario, scenario.variant("fixed"), Strategy.EXHAUSTIVE,
                   bound=2).failing == []


@pytest.mark.parametrize(("steps", "message"), [
    ("    - {op: lock, mutex: m}",
     "12:7: spec.steps[1]: lock is for host threads: give this step a `thread:` (the thread "
     "that takes the mutex)"),
    ("    - {op: unlock, mutex: m, thread: t}",
     "12:27: spec.steps[1].mutex: thread 't' unlocks mutex 'm', which it does not hold; lock "
     "it first, on the same thread"),
    ("    - {op: lock, mutex: m, thread: t}\n    - {op: lock, mutex: m, thread: t}",
     "13:25: spec.steps[2].mutex: thread 't' locks mutex 'm' again while it holds it (since "
     "steps[1], threads.yaml:12:7): that waits forever; unlock it first"),
    ("    - {op: lock, mutex: m, thread: t}\n    - {op: synchronize}",
     "13:7: spec.steps[2]: thread 't' still holds mutex 'm' (locked at steps[1], "
     "threads.yaml:12:7) when its threads end at this step; unlock it on that thread before"),
    ("    - {op: lock, mutex: m, thread: t}",
     "12:7: spec.steps[1]: thread 't' still holds mutex 'm' (locked at steps[1], "
     "threads.yaml:12:7) when its threads end at the last step; unlock it on that thread "
     "before"),
    ("    - {op: synchronize, thread: Bad}",
     "12:33: spec.steps[1].thread: invalid name 'Bad': use lower-case letters, digits, '-' and "
     "'_', starting with a letter or digit"),
])
def test_mistakes_with_threads(tmp_path: Path, steps: str, message: str) -> None:
    text = HEAD.replace("buggy: {expect: reproduces}\n", "") + \
        "  steps:\n    - {op: synchronize}\n" + steps + "\n"
    with pytest.raises(ScenarioError) as err:
        load_scenario(_write(tmp_path, text))
    assert str(err.value).split("threads.yaml:", 1)[1].replace(str(tmp_path) + "/", "") == \
        message


def test_hold_must_name_a_threaded_step(tmp_path: Path) -> None:
    text = REUSE.replace("  steps:", "  amplify: {delay_us: 100, before: copy, hold: dst}\n"
                                     "  steps:")
    with pytest.raises(ScenarioError, match="step 'dst' runs on no host thread; `hold` holds"):
        load_scenario(_write(tmp_path, text))


def test_real_threads_run_the_same_scenarios(tmp_path: Path) -> None:
    """The GPU's way, real threads, here on the simulated device: handoffs wait, the fixed
    variant stays clean, the held thread sleeps and the race shows, a thread's failure ends the
    trial."""
    from harness.run.executor import TrialExecutor

    def outcomes(text: str, variant: str, amplify: bool = False, trials: int = 5) -> set[str]:
        scenario = load_scenario(_write(tmp_path, text))
        executor = TrialExecutor(scenario, scenario.variant(variant), "sim", amplify=amplify,
                                 real_threads=True)
        return {executor.run(i, i).outcome.value for i in range(trials)}

    assert outcomes(REUSE, "fixed") == {"clean"}
    held = REUSE.replace("  steps:", "  amplify: {delay_us: 20000, before: copy, "
                                     "hold: other-alloc}\n  steps:")
    assert outcomes(held, "buggy", amplify=True) == {"corruption"}
    assert outcomes(held, "fixed", amplify=True) == {"clean"}
    stale = HEAD.replace("buggy: {expect: reproduces}\n", "") + """\
  steps:
    - {op: host_fill, buffer: data, byte: 1}
    - {id: page, op: materialize, pages: 1}
    - {op: copy_from_host, src: data, dst: page, stream: s, thread: reader}
    - {op: release, lease: page, thread: owner}
    - {op: synchronize}
"""
    scenario = load_scenario(_write(tmp_path, stale))
    executor = TrialExecutor(scenario, scenario.variant("fixed"), "sim", real_threads=True,
                             schedule=Schedule.parse("s1-~0.1"))
    # Whichever thread goes first, real threads: a read of a released page is refused.
    results = {executor.run(i, i).outcome.value for i in range(20)}
    assert results <= {"clean", "corruption"}
    # A thread that fails holding a mutex gives it back: the one waiting for it ends too.
    failing = HEAD.replace("buggy: {expect: reproduces}\n", "") + """\
  amplify: {delay_us: 20000, before: pause, hold: [a-check]}
  steps:
    - {op: host_fill, buffer: data, byte: 1}
    - {op: lock, mutex: m, thread: a}
    - {id: pause, op: delay, us: 10, stream: s, thread: a}
    - {id: a-check, op: check, buffer: data, byte: 2, thread: a}
    - {op: unlock, mutex: m, thread: a}
    - {op: lock, mutex: m, thread: b}
    - {op: unlock, mutex: m, thread: b}
"""
    import threading

    scenario_f = load_scenario(_write(tmp_path, failing))
    # Held before its check, thread a goes on only once b waits for the mutex a holds.
    executor_f = TrialExecutor(scenario_f, scenario_f.variant("fixed"), "sim", real_threads=True)
    seen: list[str] = []
    for i in range(10):
        trial = threading.Thread(target=lambda i=i: seen.append(
            executor_f.run(i, i).outcome.value), daemon=True)
        trial.start()
        trial.join(10)
        assert not trial.is_alive(), f"trial {i} hangs: a mutex was never given back"
    assert seen == ["corruption"] * 10
    # The hold forces the deadlock on real threads too: t1 takes a, t2 takes b and waits for a,
    # and t1's held second lock is for b. The trial ends as a hang that says who waits for what.
    deadlock = DEADLOCK.replace("{op: lock, mutex: b, thread: t1}",
                                "{id: t1-b, op: lock, mutex: b, thread: t1}").replace(
        "  steps:\n", "  amplify: {delay_us: 10, before: pause, hold: t1-b}\n  steps:\n"
                      "    - {id: pause, op: delay, us: 1, stream: s}\n")
    scenario_d = load_scenario(_write(tmp_path, deadlock))
    executor_d = TrialExecutor(scenario_d, scenario_d.variant("buggy"), "sim", amplify=True,
                               real_threads=True)
    hung = executor_d.run(0, 0)
    assert hung.outcome.value == "hang"
    assert hung.detail == (
        "the host threads deadlocked: thread t1 waits at t1-b for mutex b (held by thread "
        "t2); thread t2 waits at 6:lock for mutex a (held by thread t1)")
    fixed_d = TrialExecutor(scenario_d, scenario_d.variant("fixed"), "sim", amplify=True,
                            real_threads=True)
    assert {fixed_d.run(i, i).outcome.value for i in range(5)} == {"clean"}
    interleaved = TrialExecutor(scenario, scenario.variant("fixed"), "sim",
                                schedule=Schedule.parse("s1-~0.1"))
    result = interleaved.run(0, 0)
    assert result.outcome.value == "corruption"
    assert result.detail.startswith("2:copy_from_host (thread reader): the pool refused: page 0 ")
