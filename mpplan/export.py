"""Exports of a plan's placement in the formats users already run.

* ``accelerate``: a ``device_map`` ``{module_path: device_index}`` for
  ``accelerate.dispatch_model`` (inference plans: accelerate moves weights, it does
  not train across devices).  Nested entries that agree with their parent collapse
  into it, as accelerate writes its own maps.
* ``split-points``: the module paths where each pipeline stage after the first
  begins, for ``torch.distributed.pipelining``'s ``SplitPoint.BEGINNING``.  A stage
  may return to an earlier device (a head tied to the embedding runs where the
  embedding's weight lives): run such plans with a looped schedule, one rank per
  device and the stages of ``plan.module_devices`` on it.
"""

from __future__ import annotations

from typing import Any

from mpplan.errors import PlanError
from mpplan.plan import Plan

FORMATS = ("accelerate", "split-points")


def export(plan: Plan, fmt: str) -> Any:
    if fmt == "accelerate":
        return accelerate_device_map(plan)
    if fmt == "split-points":
        return split_points(plan)
    raise PlanError(f"export: unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def accelerate_device_map(plan: Plan) -> dict[str, int]:
    """``{module_path: device index}`` over non-overlapping module paths.

    Starts from the innermost modules (those with no submodule in the plan) and
    merges siblings into their parent while they all sit on one device.
    """
    if not plan.module_devices:
        raise PlanError("plan has no module paths (a graph file?): nothing to export as a device_map")
    index = {d.name: i for i, d in enumerate(plan.devices)}
    modules = list(plan.module_devices)
    leaves = {m: index[plan.module_devices[m]] for m in modules if not any(o.startswith(m + ".") for o in modules)}
    changed = True
    while changed:
        changed = False
        by_parent: dict[str, list[str]] = {}
        for m in leaves:
            if "." in m:
                by_parent.setdefault(m.rsplit(".", 1)[0], []).append(m)
        for parent, children in by_parent.items():
            if parent and len({leaves[c] for c in children}) == 1 and not any(
                o.startswith(parent + ".") and o not in children for o in leaves
            ):
                device = leaves[children[0]]
                for c in children:
                    del leaves[c]
                leaves[parent] = device
                changed = True
                break

    def first_use(prefix: str) -> int:
        return min(i for i, m in enumerate(modules) if m == prefix or m.startswith(prefix + "."))

    return dict(sorted(leaves.items(), key=lambda kv: first_use(kv[0])))


def split_points(plan: Plan) -> list[str]:
    """First module of every stage after the first, in forward order."""
    points, current = [], None
    for module, device in plan.module_devices.items():
        if current is not None and device != current:
            points.append(module)
        current = device
    return points
