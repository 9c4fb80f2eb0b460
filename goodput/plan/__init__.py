"""goodput.plan: the arithmetic that decides cadence, storage and spot use.

Pure functions, no I/O, SI units in and out (seconds, bytes, bytes/s, FLOP/s, events per second);
:mod:`goodput.plan.units` reads and writes human units. Each module cites its sources:
:mod:`failures` (Llama 3), :mod:`interval` (Young, Daly), :mod:`size` (ZeRO), :mod:`tokens`,
:mod:`activations` (Korthikanti et al.), :mod:`spot`, :mod:`pcie`, :mod:`nccl` (which transport a
connection uses), and :mod:`run` (one report joining them).
"""
