"""The simulator and its reports: workloads and traces, the simulated world, the ledger, the metrics,
the policy comparison, its report, and the independent checker of an event log.

The simulated world is :mod:`goodput.sched.sim.simulator`; this package imports nothing itself, so
that ``goodput.sched.sim.checker`` can be loaded to check a live service's log without the simulator.
"""
