"""goodput: keep large-model training runs doing useful work through failures and preemptions.

Parts: :mod:`goodput.ckpt` (distributed checkpoints), :mod:`goodput.plan` (the arithmetic of
cadence, storage and spot), :mod:`goodput.sched` (a checkpoint-aware scheduler).
"""

__version__ = "0.1.0"
