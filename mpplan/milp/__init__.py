"""Solving MILPs: the backends (``backends``: HiGHS through highspy, or scipy's milp) and a
worker process that kills a solve overrunning its time limit (``worker``).

Shared by remat's and assign's MILPs (``mpplan.passes.remat.ilp.solve_arrays`` is their
entry point).  Its modules import no planner code (only ``mpplan/__init__`` runs, 70 ms of a
worker's start), so a worker process starts quickly."""
