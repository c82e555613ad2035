"""The rule policies of remat: MXNet's mirror plan and Chen et al.'s sqrt(n) checkpoints.

Both choose from the candidates of ``mpplan.passes.remat.model`` by a fixed rule and
leave the rewrite to it.

``mirror``
    MXNet's mirror plan (``make_mirror_plan`` of its memory-cost example).  Forward
    ops are grouped into stages: ``Op.stage`` where the graph marks any (unmarked
    ops are then recomputed whenever possible, as MXNet mirrors every unmarked node;
    the mark ``"True"`` starts a stage of its own at every op), else the op's module
    up to its first numeric component (``layers.3.attn.qkv`` -> ``layers.3``) or
    its first component (``mid.conv1`` -> ``mid``), else the op's own name.  Walk
    the forward ops in order adding each op's output bytes to ``local``; at the first
    op of each stage, if ``local > threshold`` the stage is *kept* (a checkpoint:
    its activations are stored; ``local`` restarts at 0 and the kept stage's later
    ops count towards the next stretch), otherwise the whole stage is *recomputed*.
    So ``threshold`` bounds the bytes of a recomputed stretch: 0 keeps every stage
    that follows any bytes (nothing is recomputed), a huge threshold recomputes every
    stage.  ``mirror_search`` is MXNet's threshold search.
``sqrt``
    Chen et al.'s sqrt(n) checkpoints: the ``n`` forward ops that make storage are
    cut into ``round(sqrt(n))`` segments of about equal output bytes; the last op of
    each segment is kept, the others are recomputed.

>>> from mpplan.capture import synthetic
>>> sqrt_checkpoints(synthetic.chain(4, train=True))
('layers.0', 'layers.1', 'layers.3')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpplan.graph import Graph, Op
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.model import RematModel, build_model
from mpplan.passes.remat.rewriting import candidate_indices

__all__ = ["MirrorPlan", "mirror_plan", "mirror_search", "mirror_thresholds", "sqrt_checkpoints"]


@dataclass(frozen=True, slots=True)
class MirrorPlan:
    """MXNet's plan at one threshold: ops to recompute, the largest recomputed stretch
    (``max_size``, MXNet's ``plan_info['max_size']``) and the kept bytes (``save_size``)."""

    threshold: int
    recompute: tuple[str, ...]
    max_size: int
    save_size: int


def _forward_ops(model: RematModel) -> list[int]:
    """The ops the rules walk: before the backward line (every op without one)."""
    ops = model.graph.ops
    return [k for k in range(model.boundary) if ops[k].recompute_of is None and ops[k].backward_of is None]


def _made_bytes(graph: Graph, k: int) -> int:
    """Bytes of the new storage op ``k`` makes (views and in-place outputs make none)."""
    topo = graph.topology
    return sum(topo.nbytes[t] for t in topo.op_outputs[k] if topo.storage_of[t] == t and topo.producer[t] == k)


def _stage_key(op: Op, marked: bool) -> str | None:
    """The mirror stage of ``op`` (module docstring); ``None``: unmarked in a marked graph."""
    if marked:
        return op.stage
    if op.module:
        parts = op.module.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                return ".".join(parts[: i + 1])
        return parts[0]
    return op.name


def mirror_plan(graph: Graph, threshold: int, *, model: RematModel | None = None) -> MirrorPlan:
    """MXNet's ``make_mirror_plan`` at ``threshold`` bytes (module docstring's rule)."""
    model = build_model(graph) if model is None else model
    ops = graph.ops
    forward = _forward_ops(model)
    marked = any(ops[k].stage is not None for k in forward)
    local = save = max_size = 0
    last_stage: str | None = None
    keep_stage = False
    recompute: list[str] = []
    candidates = set(model.cand_op)
    for k in forward:
        size = _made_bytes(graph, k)
        local += size
        stage = _stage_key(ops[k], marked)
        keep = False
        if stage is not None:
            if stage == "True" or stage != last_stage:
                if local > threshold:  # this stretch is long enough: checkpoint here
                    save += size
                    max_size = max(max_size, local)
                    local = 0
                    keep_stage = True
                    keep = True
                else:
                    keep_stage = False
                last_stage = stage
            elif keep_stage:
                save += size
                keep = True
        if not keep and k in candidates:
            recompute.append(ops[k].name)
    return MirrorPlan(threshold, tuple(recompute), max_size, save)


def mirror_thresholds(graph: Graph, *, ntrial: int = 6, model: RematModel | None = None) -> tuple[int, ...]:
    """The thresholds (bytes) MXNet's ``search_plan`` tries, in its order, without repeats.

    Three rounds from threshold 0, each guessing ``sqrt(save_size * max_size / 2)``
    from the last mirror plan; then ``ntrial`` evenly spaced thresholds between the
    smallest ``max_size`` seen and ``sqrt(2)`` times the last guess.  ``mpplan
    search`` measures them (``{generate: mxnet}`` on ``planner.remat.threshold``).
    """
    model = build_model(graph) if model is None else model
    tried = []
    threshold, min_threshold = 0, None
    for _ in range(3):
        tried.append(threshold)
        plan = mirror_plan(graph, threshold, model=model)
        if min_threshold is None or plan.max_size < min_threshold:
            min_threshold = plan.max_size
        threshold = int(math.sqrt(plan.save_size * plan.max_size / 2))
    assert min_threshold is not None
    step = int((threshold * math.sqrt(2) - min_threshold) / ntrial)
    if step > 0:
        tried += [min_threshold + step * (i + 1) for i in range(ntrial)]
    return tuple(dict.fromkeys(tried))


def mirror_search(graph: Graph, *, ntrial: int = 6, model: RematModel | None = None) -> tuple[int, int]:
    """MXNet's ``search_plan``: of the ``mirror_thresholds``, the one whose mirror plan has the least peak.

    Peaks are ``static + LOAD`` of each rewritten graph's as-given order; ties go to
    the least recompute cost, then the smaller threshold.  Returns ``(threshold, peak)``.
    """
    model = build_model(graph) if model is None else model
    history = []
    for threshold in mirror_thresholds(graph, ntrial=ntrial, model=model):
        ev = evaluate(model, candidate_indices(model, mirror_plan(graph, threshold, model=model).recompute))
        history.append((ev.peak, ev.cost, threshold))
    peak, _, best = min(history)
    return best, peak


def sqrt_checkpoints(graph: Graph, *, model: RematModel | None = None) -> tuple[str, ...]:
    """Chen et al.'s sqrt(n) plan: the ops to recompute (module docstring)."""
    model = build_model(graph) if model is None else model
    makers = [k for k in _forward_ops(model) if _made_bytes(graph, k) > 0]
    if not makers:
        return ()
    segments = max(1, round(math.sqrt(len(makers))))
    total = sum(_made_bytes(graph, k) for k in makers)
    keep, done, cut = set(), 0, 1
    for pos, k in enumerate(makers):
        done += _made_bytes(graph, k)
        # The last op of a segment is kept: the segment ends where the bytes pass the next cut.
        if done * segments >= cut * total or pos == len(makers) - 1:
            keep.add(k)
            while done * segments >= cut * total:
                cut += 1
    candidates = set(model.cand_op)
    return tuple(graph.ops[k].name for k in makers if k not in keep and k in candidates)
