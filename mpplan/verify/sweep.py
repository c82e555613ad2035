"""``replay``'s questions of a plan without copies, as numpy columns: a fast ``Replay``, or None without words.

``replay`` walks the schedule op by op in Python, with dict and list work per tensor
reference: on a plan of 100k ops, the verifier's largest cost.  A plan without copies
needs none of its per-step state: every answer is a reduction over the references
(step, tensor, read or write), laid out once as arrays in schedule order.

- A read sees its tensor made: the tensor's maker (an op writing it, not in place) ran
  at an earlier step.
- A read sees the version of its storage the graph's order gives: the in-place writes
  to the storage at earlier steps are as many as those by earlier ops of the graph.
- A storage lives on one device: every step touching it runs on one device.
- First and last steps, and the order storages are first touched: the first and last
  reference to each storage.

When all of these hold, the result is the ``Replay`` that ``replay`` would return;
when one does not (or a tensor has two makers, which ``replay`` does not check), the
answer is None, and the caller runs ``replay``, which words the first violation.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import numpy.typing as npt

from mpplan.verify.record import Replay

_Ints = npt.NDArray[np.int64]


def sweep(names: list[str], index: dict[str, int], inputs: Sequence[tuple[int, ...]],
          outputs: Sequence[tuple[int, ...]], op_of: Sequence[int], root_of: Sequence[int], device: Sequence[int],
          devices: Sequence[str]) -> Replay | None:
    """The ``Replay`` of the schedule that runs op ``op_of[i]`` at step ``i`` (each op once, no copies), or
    None when some check fails.

    ``names`` and ``index`` are ``record.numbering``'s; ``inputs`` and ``outputs`` (by op number, its
    place in the graph's order) are ``replay.op_numbers``'s; ``root_of`` gives each tensor's storage
    number; ``device[i]`` is the position in ``devices`` of step ``i``'s op.
    """
    steps, count = len(op_of), len(names)
    ins, outs = list(map(inputs.__getitem__, op_of)), list(map(outputs.__getitem__, op_of))
    n_in = np.fromiter(map(len, ins), np.int64, steps)
    width = n_in + np.fromiter(map(len, outs), np.int64, steps)
    total = int(width.sum())
    tensor = np.fromiter(chain.from_iterable(chain.from_iterable(zip(ins, outs))), np.int64, total)  # ins, then outs
    step = np.repeat(np.arange(steps, dtype=np.int64), width)
    written = np.arange(total, dtype=np.int64) - (np.cumsum(width) - width)[step] >= n_in[step]
    read = ~written
    # An output its op also reads is written in place; any other output makes its tensor.
    in_place = np.zeros(total, dtype=bool)
    in_place[written] = _within(step[written] * count + tensor[written], np.sort(step[read] * count + tensor[read]))
    makes = written & ~in_place
    made = tensor[makes]
    if len(made) and np.bincount(made).max() > 1:
        return None  # a tensor made twice
    made_at = np.full(count, -1, dtype=np.int64)
    made_at[made] = step[makes]
    if (made_at[tensor[read]] >= step[read]).any():
        return None  # a read before its tensor is made
    storage = np.asarray(root_of, dtype=np.int64)[tensor]
    rewritten = np.zeros(count, dtype=bool)
    rewritten[storage[in_place]] = True
    kept = rewritten[storage]  # the references to storages written in place somewhere: the others stay at 0
    at = np.asarray(op_of, dtype=np.int64)[step[kept]]  # each reference's op's place in the graph's order
    if not _same_versions(storage[kept], step[kept], at, read[kept], in_place[kept], steps + 1):
        return None  # a read of another version than the graph's order gives
    position = np.arange(total, dtype=np.int64)
    first_ref, last_ref = _extremes(storage, position, count, total)
    touched = np.flatnonzero(last_ref >= 0)
    where = np.asarray(device, dtype=np.int64)[step]
    if len(devices) > 1 and (np.not_equal(*_extremes(storage, where, count, len(devices))))[touched].any():
        return None  # a storage touched on two devices
    first = np.full(count, -1, dtype=np.int64)
    last = np.full(count, -1, dtype=np.int64)
    first[touched], last[touched] = step[first_ref[touched]], step[last_ref[touched]]
    on = np.full(count, len(devices), dtype=np.int64)  # a device's position; past the last: untouched
    on[touched] = where[first_ref[touched]]
    home: list[str | None] = np.array([*devices, None], dtype=object)[on].tolist()
    order = storage[np.sort(first_ref[touched])]  # in the order first touched, as ``replay`` lists them
    return Replay(names, index, order.tolist(), first.tolist(), last.tolist(), home, {}, [])


def _within(keys: _Ints, sorted_keys: _Ints) -> npt.NDArray[np.bool_]:
    """Whether each of ``keys`` is one of ``sorted_keys``."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def _extremes(group: _Ints, values: _Ints, groups: int, above: int) -> tuple[_Ints, _Ints]:
    """The least and the greatest of ``values`` (each in ``[0, above)``) in each group: ``above`` and -1
    for a group without values."""
    least = np.full(groups, above, dtype=np.int64)
    most = np.full(groups, -1, dtype=np.int64)
    np.minimum.at(least, group, values)
    np.maximum.at(most, group, values)
    return least, most


def _same_versions(storage: _Ints, step: _Ints, at: _Ints, read: npt.NDArray[np.bool_],
                   in_place: npt.NDArray[np.bool_], span: int) -> bool:
    """Each read sees as many in-place writes to its storage at earlier steps as by earlier ops of the graph.

    ``at`` is each reference's op's place in the graph's order; keys ``storage * span + step``
    sort the writes by storage, then step, so a binary search counts a storage's earlier writes
    (all of an op's reads come before its writes).
    """
    by_step = np.sort(storage[in_place] * span + step[in_place])
    by_graph = np.sort(storage[in_place] * span + at[in_place])
    seen = np.searchsorted(by_step, storage[read] * span + step[read])
    wanted = np.searchsorted(by_graph, storage[read] * span + at[read])
    return bool((seen == wanted).all())
