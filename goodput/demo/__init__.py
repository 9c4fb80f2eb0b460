"""The demos behind ``goodput demo`` and the local multi-process launcher they and the tests use.

``train`` (the end-to-end checkpoint demo, its ranks in ``worker``), ``reshard``, ``sched`` (the
simulator), ``live`` (the service and one real preemption), ``sched_live`` (torchrun jobs under
the service, SIGKILLed mid-way), ``localdist`` (gloo ranks as local processes).
"""
