"""Where each module ended up: the device of every module path under a placement, for ``plan.module_devices``.

``mpplan.runtime.apply`` and the accelerate export read it to put a user's submodules
on the devices the plan chose.
"""

from __future__ import annotations

from mpplan.graph import Kind
from mpplan.passes.copies import Listing
from mpplan.passes.place.complete import forward_ops


def module_devices(listed: Listing) -> dict[str, str]:
    """Module path -> device of its first forward op making storage, in schedule order; then the
    modules owning parameters (by the parameter's name), with the parameter's home."""
    graph, order = listed.graph, listed.order
    forward = {k for k in forward_ops(graph, order) if graph.ops[k].type != "copy"}
    modules: dict[str, str] = {}
    topo = graph.topology
    storage_of = topo.storage_of
    for step, k in enumerate(order):
        op = graph.ops[k]
        # view ops run with their base, elsewhere; the cheap tests first, the storage scan only for forward ops
        if k in forward and op.module and any(storage_of[t] == t for t in topo.op_outputs[k]):
            modules.setdefault(op.module, listed.op_device[step])
    for t, tensor in enumerate(graph.tensors):
        if tensor.kind is Kind.PARAM and "." in tensor.name:
            modules.setdefault(tensor.name.rsplit(".", 1)[0], listed.storage_device[t])
    return modules
