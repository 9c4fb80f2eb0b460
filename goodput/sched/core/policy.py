"""Policies: ours and the baselines everyone ships, each differing from ours in one named rule.

The simulator runs them on the same workload and the same cluster events, so every difference in
the results comes from the rule a baseline changes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Policy:
    name: str = "goodput"
    victims: str = "checkpoint-aware"  # | "oblivious": lowest priority, then shortest running (Kueue)
    ask_checkpoint: bool = True  # the notice asks for a checkpoint when the grace fits the write
    release: str = "observed"  # | "decision": GPUs handed on when the preemption is decided
    backfill: bool = True  # False: the blocked head blocks everyone behind it
    spot_rule: str = "arithmetic"  # | "price": any spot-allowed job goes to the cheapest pool first
    preemption: bool = True
    # a priority preemption is made only when its victims' expected loss is at most ``wait_worth``
    # times the GPU-time the preemptor would wait for its reservation (a victim's loss is waste; the
    # preemptor's wait is not: others use the GPUs meanwhile). False: whatever it costs, as Kueue does
    weigh_wait: bool = True
    wait_worth: float = 0.1
    # a one-node job that needs more GPUs than any node has free may have the few one-node jobs of
    # no higher priority on a nearly free node checkpointed and restarted on the free GPUs of
    # others (a ``move``): only when their expected loss is at most ``move_worth`` times the
    # GPU-seconds it would wait. Ten times stricter than ``wait_worth``: a move disturbs peers, not
    # lower priorities, for a start that is only sooner (docs/SCHED.md, "Moving jobs to free a node")
    defrag: bool = True
    move_worth: float = 0.01

    def __reduce__(self) -> tuple[type[Policy], tuple[Any, ...]]:
        """Rebuilt through its constructor (pickle, copy): compiled, a frozen dataclass refuses the
        attribute-by-attribute state they would set otherwise."""
        return (Policy, tuple(getattr(self, f.name) for f in fields(self)))

    def describe(self) -> str:
        return {
            "goodput": "checkpoint-aware victims, only when cheaper than waiting; release when gone, backfill, "
            "spot by expected loss, moves to free a node",
            "kueue-victims": "victims by lowest priority then shortest running, whatever they lose; plain stop",
            "release-at-decision": "GPUs handed to the preemptor when the preemption is decided",
            "fifo-no-backfill": "priority order; the blocked head blocks every job behind it",
            "spot-by-price": "spot-allowed jobs go to the cheapest pool whatever their expected loss",
        }.get(self.name, self.name)


POLICIES: dict[str, Policy] = {
    "goodput": Policy(),
    "kueue-victims": Policy(name="kueue-victims", victims="oblivious", ask_checkpoint=False, weigh_wait=False),
    "release-at-decision": Policy(name="release-at-decision", release="decision"),
    "fifo-no-backfill": Policy(name="fifo-no-backfill", backfill=False),
    "spot-by-price": Policy(name="spot-by-price", spot_rule="price"),
}


def policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
