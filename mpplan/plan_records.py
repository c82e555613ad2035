"""Typed records for two parts of ``plan.json``: ``planner.settings`` and the ``remat`` list.

Both are frozen dataclasses that are also read-only mappings over their ``plan.json``
keys, so code written against the loose dicts they replace (``settings.get("grads")``,
``record["op"]``, ``{**settings, "alignment": 1}``, ``dict(record)``) keeps working while
new code reads typed attributes.  ``to_dict`` gives back exactly the mapping they were
made from, keys in the same order, so ``plan.json`` bytes do not change.

A plan file is untrusted input: ``from_mapping`` checks each known key's type and raises
``PlanError`` naming the file and the field.  Settings that a plan does not state stay
absent (the verifier supplies its defaults), and keys this version does not know are kept.

>>> record = RematRecord("h", "relu", "relu@recompute", "h@recompute", 64)
>>> record["op"], record.bytes, dict(record) == record.to_dict(), record.from_op
('relu', 64, True, None)
>>> RematRecord.from_mapping({**record, "from_op": "mul"}).to_dict()["from_op"]
'mul'
>>> settings = PlanSettings.from_mapping({"alignment": 64, "grads": "dynamic", "future_knob": 1})
>>> settings.alignment, settings.get("parallel_safe", False), list(settings)
(64, False, ['alignment', 'grads', 'future_knob'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpplan.errors import PlanError


@dataclass(frozen=True, slots=True, eq=False)
class RematRecord(Mapping[str, Any]):
    """One recomputed tensor: ``op`` made ``tensor``; ``recompute_op`` makes ``recompute_tensor`` again, late.

    A later round's record names a recompute op as ``op`` (``F@recompute``): it repeats
    that recompute.  ``bytes`` is the recomputed tensor's size.  ``from_op``, when
    stated, is the op of the round's graph from which on readers of ``tensor`` read
    ``recompute_tensor`` (the start of its late region, chosen by the solver), or
    ``@recomputes`` when only other recomputes of the round read it (a chain link); absent, the
    late region starts where the remat model's rule puts it (the first backward op, or the
    tensor's largest gap), as in plans made before the field.  Several records of one
    tensor, over successive rounds, keep it over several retention intervals.  Equal to
    its dict form, which states ``from_op`` only when set (older plans keep their bytes).
    """

    tensor: str
    op: str
    recompute_op: str
    recompute_tensor: str
    bytes: int
    from_op: str | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<plan>", where: str = "remat[]") -> RematRecord:
        """The record of one ``plan.json`` ``remat`` entry; ``PlanError`` naming the field when it is malformed."""
        if isinstance(data, RematRecord):
            return data
        if not isinstance(data, Mapping):
            raise PlanError(f"{source}: {where}: expected a mapping, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise PlanError(f"{source}: {where}.{key}: unknown key; expected one of {', '.join(names)}")
        values = {}
        for name in names:
            if name not in data:
                if name in _OPTIONAL_KEYS:
                    continue
                raise PlanError(f"{source}: {where}.{name}: missing")
            values[name] = _checked(data[name], int if name == "bytes" else str, source, f"{where}.{name}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The ``plan.json`` form."""
        return {key: getattr(self, key) for key in self._keys()}

    def _keys(self) -> tuple[str, ...]:
        return _REMAT_KEYS if self.from_op is None else (*_REMAT_KEYS, *_OPTIONAL_KEYS)

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())


_REMAT_KEYS = ("tensor", "op", "recompute_op", "recompute_tensor", "bytes")
#: Keys a record states only when set.
_OPTIONAL_KEYS = ("from_op",)


@dataclass(frozen=True, slots=True, eq=False)
class PlanSettings(Mapping[str, Any]):
    """``planner.settings``: the settings a plan was made with (``planner:`` of the config) and what it chose.

    A field is ``None`` when the plan does not state it (or states null); ``order`` holds the keys
    the plan states, in its order (by default: the fields set, then ``extra``), and ``extra`` the
    values of keys this version does not know.
    The verifier checks ``alignment``, ``parallel_safe`` and ``grads`` against a config.
    """

    schedule: str | None = None
    assign: str | None = None
    alignment: int | None = None
    parallel_safe: bool | None = None
    grads: str | None = None
    placement: str | None = None
    device_map: Mapping[str, str] | None = None
    no_split: list[str] | None = None
    shift: Mapping[str, Any] | None = None
    remat: Mapping[str, Any] | None = None
    placement_chosen: str | None = None
    remat_chosen: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.order:
            stated = [key for key in _SETTING_TYPES if getattr(self, key) is not None]
            object.__setattr__(self, "order", (*stated, *self.extra))

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], source: str = "<plan>", where: str = "planner.settings"
    ) -> PlanSettings:
        """The record of a ``planner.settings`` mapping; ``PlanError`` naming the field on a wrong type."""
        if isinstance(data, PlanSettings):
            return data
        if not isinstance(data, Mapping):
            raise PlanError(f"{source}: {where}: expected a mapping, got {type(data).__name__}")
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            key = str(key)
            kind = _SETTING_TYPES.get(key)
            if kind is None:
                extra[key] = value
            else:
                known[key] = None if value is None else _checked(value, kind, source, f"{where}.{key}")
        if isinstance(known.get("device_map"), dict) and not all(
            isinstance(v, str) for v in known["device_map"].values()
        ):
            raise PlanError(f"{source}: {where}.device_map: expected a mapping of module prefix to device name")
        if isinstance(known.get("no_split"), list) and not all(isinstance(v, str) for v in known["no_split"]):
            raise PlanError(f"{source}: {where}.no_split: expected a list of module prefixes")
        return cls(**known, extra=extra, order=tuple(str(k) for k in data))

    def to_dict(self) -> dict[str, Any]:
        """The ``plan.json`` form: the keys the plan states, in its order."""
        return {key: self[key] for key in self.order}

    def __getitem__(self, key: str) -> Any:
        if key not in self.order:
            raise KeyError(key)
        return getattr(self, key) if key in _SETTING_TYPES else self.extra[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


#: The keys of ``planner.settings`` this version knows, and the JSON type of each.
_SETTING_TYPES: dict[str, type] = {
    "schedule": str, "assign": str, "alignment": int, "parallel_safe": bool, "grads": str, "placement": str,
    "device_map": dict, "no_split": list, "shift": dict, "remat": dict, "placement_chosen": str,
    "remat_chosen": dict,
}

_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping", list: "a list"}


def _checked(value: Any, kind: type, source: str, where: str) -> Any:
    """``value`` when it is of JSON type ``kind`` (a bool is no integer), else ``PlanError`` naming ``where``."""
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        text = repr(value)
        shown = text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"
        raise PlanError(f"{source}: {where}: expected {_TYPE_NAMES[kind]}, got {shown}")
    return value
