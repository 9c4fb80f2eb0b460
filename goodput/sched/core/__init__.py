"""What the simulator and the live service share: the model, the rules of a job's life, and the scheduler.

Nothing here imports :mod:`goodput.sched.sim` or :mod:`goodput.sched.live`: both drive this core,
through the :class:`~goodput.sched.core.executor.Executor` and clock interfaces, and must decide alike.
"""
