"""kvcore.bytemap: the one map of byte ownership, against a byte-by-byte model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.bytemap import ByteMap, Span

SIZE = 64
_range = st.tuples(st.integers(0, SIZE), st.integers(0, SIZE)).map(sorted)
_ops = st.lists(st.tuples(st.sampled_from(["put", "put_whole", "cut", "remove", "pop"]),
                          _range, st.integers(0, 5)), max_size=40)


def _bytes(spans: ByteMap) -> list[object]:
    """Who holds each byte, as the map says it."""
    owner: list[object] = [None] * SIZE
    for span in spans:
        for b in range(span.lo, span.hi):
            assert owner[b] is None, f"byte {b} held twice"
            owner[b] = span.value
    return owner


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_the_map_holds_what_a_byte_by_byte_model_holds(ops):
    spans = ByteMap()
    model: list[object] = [None] * SIZE
    starts: dict[int, tuple[int, int]] = {}  # a span's start: its (lo, hi), to model whole drops
    for op, (lo, hi), value in ops:
        if op in ("put", "put_whole"):
            whole = op == "put_whole"
            if lo < hi:
                gone = {(a, b) for a, b in starts.values() if a < hi and lo < b}
                for a, b in gone:
                    del starts[a]
                    lose = range(a, b) if whole else range(max(a, lo), min(b, hi))
                    for byte in lose:
                        model[byte] = None
                    if not whole:  # the pieces outside [lo, hi) stay spans of their own
                        for x, y in ((a, lo), (hi, b)):
                            if x < y:
                                starts[x] = (x, y)
                for byte in range(lo, hi):
                    model[byte] = value
                starts[lo] = (lo, hi)
            spans.put(lo, hi, value, whole=whole)
        elif op in ("cut", "remove"):
            held = [s for s in spans.overlapping(lo, hi)]
            got = spans.cut(lo, hi) if op == "cut" else spans.remove(lo, hi)
            if op == "cut":
                assert got == [Span(max(s.lo, lo), min(s.hi, hi), s.value) for s in held]
            else:
                assert got == held
            for a, b in [(s.lo, s.hi) for s in held]:
                del starts[a]
                lose = range(max(a, lo), min(b, hi)) if op == "cut" else range(a, b)
                for byte in lose:
                    model[byte] = None
                if op == "cut":
                    for x, y in ((a, lo), (hi, b)):
                        if x < y:
                            starts[x] = (x, y)
        else:
            got = spans.pop(lo)
            if lo in starts:
                a, b = starts.pop(lo)
                assert got is not None and (got.lo, got.hi) == (a, b)
                for byte in range(a, b):
                    model[byte] = None
            else:
                assert got is None
        assert _bytes(spans) == model
        assert sorted(starts.values()) == [(s.lo, s.hi) for s in spans]
        for byte in range(SIZE):
            span = spans.at(byte)
            assert (span.value if span else None) == model[byte]


def test_a_free_in_the_middle_leaves_both_ends_with_their_owner():
    spans = ByteMap()
    spans.put(0, 4096, "lease 1")
    assert spans.cut(1024, 2048) == [Span(1024, 2048, "lease 1")]
    assert list(spans) == [Span(0, 1024, "lease 1"), Span(2048, 4096, "lease 1")]
    assert spans.at(1500) is None and spans.at(3000) == Span(2048, 4096, "lease 1")
    assert spans.starting_at(2048) == Span(2048, 4096, "lease 1")
    assert spans.starting_at(0) == Span(0, 1024, "lease 1") and spans.starting_at(1) is None


def test_a_block_carved_anew_replaces_the_old_owner_whole():
    spans = ByteMap()
    spans.put(0, 100, "old")
    assert spans.put(50, 150, "new", whole=True) == [Span(0, 100, "old")]
    assert list(spans) == [Span(50, 150, "new")]
