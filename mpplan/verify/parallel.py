"""``parallel_safe``: buffers that share memory must be ordered by the executed DAG itself.

Memonger's rule: two storages may share memory only if every step touching one is a
strict ancestor of the step that creates the other, so no executor that respects
the DAG's edges can run them at the same time.  The DAG is the one the plan runs,
copies included (``record.Replay.preds``): a tensor read on another device through a
copy is touched by the copy on its own device, not by the remote reader.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from mpplan.errors import VerificationError
from mpplan.plan import Buffer
from mpplan.verify.record import Replay


def check_parallel_safe(buffers: dict[str, Buffer], run: Replay, dynamic: Container[str],
                        first: Mapping[str, int]) -> None:
    """Fail naming two storages that share bytes of one arena without a DAG order between them
    (``first``: each dynamic storage's first step, by name)."""
    ancestors = [0] * len(run.preds)
    for step, preds in enumerate(run.preds):  # the schedule is a topological order of its DAG
        bits = 0
        for p in preds:
            bits |= ancestors[p] | (1 << p)
        ancestors[step] = bits
    users = {s: sum(1 << u for u in set(steps)) for s, steps in run.users.items() if s in dynamic}

    def before(a: str, b: str) -> bool:
        return users[a] & ~ancestors[first[b]] == 0

    ordered = sorted(users, key=lambda s: (buffers[s].device, buffers[s].offset, s))
    for i, a in enumerate(ordered):
        ba = buffers[a]
        for b in ordered[i + 1 :]:
            bb = buffers[b]
            if bb.device != ba.device or bb.offset >= ba.offset + ba.bytes:
                break
            if ba.bytes and bb.bytes and not (before(a, b) or before(b, a)):
                raise VerificationError(f"parallel_safe: tensors {a!r} and {b!r} share memory but may run concurrently")
