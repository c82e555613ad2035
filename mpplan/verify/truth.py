"""What a plan is checked against: the facts that come from the run config, not from the plan.

A plan carries copies of its devices' names and capacities and of the planner
settings that decide correctness (``alignment``, ``parallel_safe``, ``grads``).  A
plan edited to claim more capacity, a renamed device or a looser alignment must
not pass, so with a config these facts come from the config, and the plan's copies
must agree field by field.  Without one they are taken from the plan on trust, and
``Truth.trusted`` says which they were, for the CLI to print.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpplan.config import Config, resolve_devices
from mpplan.errors import VerificationError
from mpplan.plan import Plan

#: The values of ``planner.grads``: param grads resident all step, or made by backward and held to its end.
GRADS = ("static", "dynamic")
#: The plan fields taken on trust when no config is given, in the words the CLI prints.
TRUSTED_FIELDS = ("device names", "capacities", "planner.settings.alignment", "parallel_safe", "grads")


@dataclass(frozen=True, slots=True)
class Truth:
    """The facts a plan is checked against: devices (name -> usable capacity, in order) and the
    correctness-bearing planner settings.  ``trusted`` is True when they were read from the plan itself."""

    capacities: tuple[tuple[str, int], ...]
    alignment: int
    parallel_safe: bool
    grads: str
    trusted: bool


def truth_from_config(config: Config) -> Truth:
    """The facts the config states: its devices (``count`` expanded, ``reserve`` taken off) and planner settings."""
    return Truth(
        capacities=tuple((d.name, d.usable) for d in resolve_devices(config)),
        alignment=int(config.planner.alignment),
        parallel_safe=bool(config.planner.parallel_safe),
        grads=str(config.planner.grads),
        trusted=False,
    )


def truth_from_plan(plan: Plan) -> Truth:
    """The plan's own copies of the facts, taken on trust (no config to check them against)."""
    settings = plan.settings
    alignment = settings.get("alignment", 1)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise VerificationError(f"planner.settings.alignment: expected a positive integer, got {alignment!r}")
    parallel_safe, grads = settings.get("parallel_safe"), settings.get("grads")  # None: not stated, or null
    if parallel_safe is not None and type(parallel_safe) is not bool:  # bool("no") would be True
        raise VerificationError(f"planner.settings.parallel_safe: expected true or false, got {parallel_safe!r}")
    if grads is not None and grads not in GRADS:  # any other word would be taken as "static"
        raise VerificationError(f"planner.settings.grads: expected one of {', '.join(GRADS)}, got {grads!r}")
    return Truth(
        capacities=tuple((d.name, d.capacity_bytes) for d in plan.devices),
        alignment=alignment,
        parallel_safe=bool(parallel_safe),
        grads=grads or "static",
        trusted=True,
    )


def check_agrees(plan: Plan, truth: Truth) -> None:
    """Fail naming the first plan field whose copy of a fact differs from ``truth``."""
    names = [d.name for d in plan.devices]
    expected = [name for name, _ in truth.capacities]
    if names != expected:
        _fail(f"devices: the plan lists {', '.join(names) or 'none'}, the config has {', '.join(expected) or 'none'}")
    for i, (device, (_, capacity)) in enumerate(zip(plan.devices, truth.capacities)):
        if device.capacity_bytes != capacity:
            _fail(
                f"devices[{i}].capacity_bytes: the plan claims {device.capacity_bytes} for {device.name}, "
                f"the config gives {capacity}"
            )
    settings = plan.settings
    for key, value in (("alignment", truth.alignment), ("parallel_safe", truth.parallel_safe), ("grads", truth.grads)):
        default = {"alignment": 1, "parallel_safe": False, "grads": "static"}[key]
        claimed = settings.get(key, default)
        if type(claimed) is not type(value) or claimed != value:
            _fail(f"planner.settings.{key}: the plan says {claimed!r}, the config says {value!r}")


def _fail(message: str) -> None:
    raise VerificationError(message)
