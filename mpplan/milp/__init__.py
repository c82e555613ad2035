"""Solving MILPs: the backends (``backends``: HiGHS through highspy, or scipy's milp) and a
worker process that kills a solve overrunning its time limit (``worker``).

Shared by remat's and assign's MILPs (``mpplan.passes.remat.ilp.solve_arrays`` is their
entry point).  It imports nothing else of mpplan's, so a worker process starts quickly."""
