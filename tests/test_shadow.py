"""The detector's memory of a buffer's bytes (harness.races.shadow): ranges cut and joined as
accesses come, each found by bisection."""

from __future__ import annotations

import random

from harness.races.shadow import Access, Race, Shadow

THREADS = ("s1", "s2", "host")


def _access(thread: str, epoch: int, lo: int, hi: int, write: bool) -> Access:
    return Access(thread, epoch, lo, hi, write, (epoch, thread, "kernel", None, None, None))


def _races(shadow: Shadow, now: Access, clock: dict[str, int], prune: bool = True
           ) -> dict[str, Race]:
    races: dict[str, Race] = {}
    shadow.access(now, clock.get, prune, races)
    return races


def test_a_tensor_touched_whole_is_one_range_whatever_its_size() -> None:
    shadow = Shadow()
    size = 200 << 30
    for epoch in range(1, 50):
        assert _races(shadow, _access("s1", epoch, 0, size, epoch % 2 == 0), {}) == {}
    assert (shadow.starts, shadow.ends) == ([0], [size])
    # Written in two halves by the same stream, then whole again: one range once more.
    _races(shadow, _access("s1", 50, 0, size // 2, True), {})
    _races(shadow, _access("s1", 51, size // 2, size, True), {})
    assert len(shadow.starts) == 2
    _races(shadow, _access("s1", 52, 0, size, True), {})
    assert (shadow.starts, shadow.ends, shadow.remembered()) == ([0], [size], 1)


def test_the_bytes_outside_an_access_keep_their_past() -> None:
    shadow = Shadow()
    first = _access("s1", 1, 0, 100, True)
    _races(shadow, first, {})
    # s2 writes [50, 150) after s1's write (ordered): the write stands for it there only.
    assert _races(shadow, _access("s2", 1, 50, 150, True), {"s1": 1}) == {}
    assert shadow.starts == [0, 50]
    # The host reads [0, 200) ordered after neither: both writes race it, each from the
    # first byte where the read meets what is left of it.
    races = _races(shadow, _access("host", 1, 0, 200, False), {})
    assert {t: (r.past.epoch, r.start) for t, r in races.items()} == {"s1": (1, 0),
                                                                      "s2": (1, 50)}
    assert races["s1"].past is first  # the access as it was made, all its bytes


def test_a_read_does_not_stand_for_the_write_before_it() -> None:
    shadow = Shadow()
    _races(shadow, _access("s1", 1, 0, 64, True), {})
    _races(shadow, _access("s2", 1, 0, 64, False), {"s1": 1})  # ordered after the write
    # A third stream's read ordered after neither: the write races it; the read does not.
    races = _races(shadow, _access("s3", 1, 0, 64, False), {})
    assert list(races) == ["s1"]


def _naive(pasts: list[Access], now: Access, clock: dict[str, int]) -> dict[str, tuple]:
    """Every past access kept, each checked: the latest unordered conflicting one a thread."""
    found: dict[str, tuple[int, int]] = {}
    for past in pasts:
        if past.lo < now.hi and now.lo < past.hi and past.thread != now.thread \
                and past.epoch > clock.get(past.thread, 0) and (now.write or past.write):
            seen = found.get(past.thread)
            if seen is None or seen[0] < past.epoch:
                found[past.thread] = (past.epoch, max(past.lo, now.lo))
    return found


def test_unpruned_ranges_find_what_checking_every_past_access_finds() -> None:
    """Random accesses over 512 bytes with random clocks: the ranges, cut and joined, name
    the same race (the past access and the byte where it starts) as a list of every access
    checked one by one; and pruning keeps whether an access races at all when the clocks are
    those of real threads (tests/test_detector.py holds that on random programs)."""
    checked = 0
    for seed in range(200):
        rng = random.Random(seed)
        shadow, pasts = Shadow(), []
        epochs = dict.fromkeys(THREADS, 0)
        for _ in range(40):
            thread = rng.choice(THREADS)
            epochs[thread] += 1
            lo = rng.randrange(0, 512, 8)
            now = _access(thread, epochs[thread], lo, rng.randrange(lo + 1, 513),
                          rng.random() < 0.4)
            clock = {t: rng.randrange(0, e + 1) for t, e in epochs.items()}
            got = {t: (r.past.epoch, r.start)
                   for t, r in _races(shadow, now, clock, prune=False).items()}
            assert got == _naive(pasts, now, clock), seed
            checked += len(got)
            pasts.append(now)
            assert shadow.starts == sorted(shadow.starts)
            assert all(a < b for a, b in zip(shadow.starts, shadow.ends))
            assert all(b <= a for b, a in zip(shadow.ends, shadow.starts[1:]))
    assert checked > 100  # the programs do race
