"""The verifier's overlap sweep against brute force: every pair of buffers live together, compared."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.errors import VerificationError
from mpplan.plan import Buffer
from mpplan.verify import memory

#: (first step, steps live, offset, bytes) of each buffer: few steps and offsets, so overlaps are common.
_RECTS = st.lists(
    st.tuples(st.integers(0, 12), st.integers(0, 6), st.integers(0, 40), st.integers(0, 9)), max_size=60
)


def _overlapping_pairs(rects: list[tuple[int, int, int, int]]) -> set[frozenset[str]]:
    """Every pair of non-empty buffers live at a common step whose byte ranges intersect."""
    pairs = set()
    for i, (f1, n1, o1, b1) in enumerate(rects):
        for j, (f2, n2, o2, b2) in enumerate(rects[:i]):
            if b1 and b2 and f1 <= f2 + n2 and f2 <= f1 + n1 and o1 < o2 + b2 and o2 < o1 + b1:
                pairs.add(frozenset((f"t{i}", f"t{j}")))
    return pairs


@pytest.mark.parametrize("bucket", [1, 2, 256])
@settings(max_examples=150, deadline=None)
@given(rects=_RECTS)
def test_overlap_sweep_matches_brute_force(bucket: int, rects: list[tuple[int, int, int, int]]) -> None:
    """Rejected exactly when two live-together buffers intersect, naming such a pair (small buckets
    split and empty often, so the bucketed order of live buffers is exercised too)."""
    names = sorted(f"t{i}" for i in range(len(rects)))
    buffers = {f"t{i}": Buffer("gpu0", o, b) for i, (_, _, o, b) in enumerate(rects)}
    first = {f"t{i}": f for i, (f, _, _, _) in enumerate(rects)}
    last = {f"t{i}": f + n for i, (f, n, _, _) in enumerate(rects)}
    pairs = _overlapping_pairs(rects)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory, "_BUCKET", bucket)
        if not pairs:
            memory.check_no_overlap(buffers, "gpu0", names, first, last)
            return
        with pytest.raises(VerificationError, match="live together") as info:
            memory.check_no_overlap(buffers, "gpu0", names, first, last)
    named = frozenset(re.findall(r"'(t\d+)'", str(info.value)))
    assert named in pairs


def test_overlap_sweep_many_live_at_once() -> None:
    """Thousands of buffers live together (several buckets), then one that overlaps the middle one."""
    n = 3000
    names = [f"t{i:05d}" for i in range(n + 1)]
    buffers = {name: Buffer("gpu0", 64 * i, 64) for i, name in enumerate(names[:n])}
    first = {name: i for i, name in enumerate(names)}
    last = dict.fromkeys(names, n + 5)
    memory.check_no_overlap(buffers, "gpu0", names[:n], first, last)
    buffers[names[n]] = Buffer("gpu0", 64 * 1500 + 32, 64)
    with pytest.raises(VerificationError, match=r"tensors 't01500' and 't03000' are live together"):
        memory.check_no_overlap(buffers, "gpu0", names, first, last)
