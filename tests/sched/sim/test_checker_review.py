"""False positives a hostile review found in the checker's ``reservation_delayed``, each a log the
scheduler writes under ``goodput`` (found by random small workloads with node losses, spot reclaims
and quota reclaims: 19 of 700 runs flagged), and a twin that still breaks the rule.

1. A head that a capacity loss left unable to start anywhere (a 2-node gang, one of its pool's two
   nodes lost) has no reservation in the scheduler: it cannot plan a gang its pool cannot hold, nor
   know when the node returns, and it logs nothing for it. Its last ``reserved`` bound every later
   start on those nodes, so the job that took the node left was flagged.
2. A backfilled run that a claim of the same pass evicted ends by its deadline, and the pass's
   reservation, planned after the claim (``_earlier_after_claim``), may take its node for that
   reason: its start was judged by its declared end.
3. A start on a reserved node delays the head only when the head no longer fits that node at its
   reserved time beside the jobs declared to run there past it: a reservation the same claim moved
   earlier onto the node of a 4-GPU backfill was flagged for a head of 1 GPU per node.

Logs are written by hand, never by the scheduler (see test_checker.py).
"""

from __future__ import annotations

import pytest

from tests.sched.sim.test_checker_holes import Log, only, pol


@pytest.mark.parametrize(("lost", "bad"), [("b", False), ("c", True)])
def test_a_start_on_the_nodes_of_a_head_a_capacity_loss_made_unplaceable(lost: str, bad: bool) -> None:
    """h (2 x 8) is reserved a and b at 1000. b is lost at 500: no two 8-GPU nodes are left, and
    z may take a when x ends. Losing c (4 GPUs, which h never needed) excuses nothing."""
    g = Log().job("x", limit=1000.0).start("x", ["a"])
    g.job("h", nodes=2, limit=100.0).reserved("h", 1000.0, ["a", "b"])
    g.at(500).e("node_lost", node=lost)
    g.at(1000).end("x", ["a"]).job("z", limit=5000.0).start("z", ["a"])
    r = pol(g.records)
    if bad:
        only(r, "reservation_delayed")
        assert "reserved for job h at t=1000" in r.examples[0]
    else:
        only(r)


def test_a_head_made_unplaceable_binds_again_once_it_is_reserved_again() -> None:
    """After the loss the head is reserved anew (its node came back): that reservation binds."""
    g = Log().job("x", limit=1000.0).start("x", ["a"])
    g.job("h", nodes=2, limit=100.0).reserved("h", 1000.0, ["a", "b"])
    g.at(500).e("node_lost", node="b").at(600).e("node_up", node="b").reserved("h", 1000.0, ["a", "b"])
    g.at(1000).end("x", ["a"]).job("z", limit=5000.0).start("z", ["a"])
    only(pol(g.records), "reservation_delayed")


@pytest.mark.parametrize("evicted", [True, False])
def test_a_backfilled_run_evicted_in_its_own_pass_is_judged_by_its_deadline(evicted: bool) -> None:
    """s backfills onto a around h's reservation (b); a claim of the same pass evicts s (deadline
    40), and the reservation the pass logs is a at 500. s leaves long before 500; had it not been
    asked to leave, its declared end (3010) would delay h."""
    g = Log().job("w", gpn=4, limit=3000.0).start("w", ["a"], gpn=4)
    g.job("v", limit=1000.0).start("v", ["b"]).job("h", prio=5, limit=100.0)
    g.at(10).job("s", gpn=4, limit=3000.0).start("s", ["a"], gpn=4, backfill=True)
    if evicted:
        g.job("c", prio=1, gpn=8)
        for victim in ("s", "w"):
            g.e(
                "preempt_requested", job=victim, epoch=1, victim_of="c", reason="priority", preemptor="c",
                lost_s=0.0, deadline_s=40.0, checkpoint=True,
            )  # fmt: skip
    g.reserved("h", 500.0, ["a"])
    r = pol(g.records)
    if evicted:
        only(r)
    else:
        only(r, "reservation_delayed")


@pytest.mark.parametrize(("gpn", "bad"), [(4, False), (8, True)])
def test_a_start_beside_which_the_head_still_fits_delays_nothing(gpn: int, bad: bool) -> None:
    """h (2 x 1 GPU) is reserved a and c at 670; s backfills onto a until 400 around it, then a
    claim moves h's reservation earlier, to 380 on a and c (the scheduler's
    ``_earlier_after_claim``). With s on 4 of a's 8 GPUs h still fits a at 380: nothing is
    delayed (this was flagged). With s on all 8 it is."""
    g = Log().job("x", limit=1000.0).start("x", ["a"]).job("y", limit=1000.0).start("y", ["b"])
    g.job("w", gpn=4, limit=1000.0).start("w", ["c"], gpn=4)
    g.job("h", nodes=2, gpn=1, limit=100.0).reserved("h", 670.0, ["a", "c"])
    g.at(100).end("x", ["a"]).job("s", gpn=gpn, limit=300.0).start("s", ["a"], gpn=gpn, backfill=True)
    g.job("c1", gpn=4, prio=1)
    g.e(
        "preempt_requested", job="w", epoch=1, victim_of="c1", reason="quota", preemptor="c1",
        lost_s=0.0, deadline_s=160.0, checkpoint=True,
    )  # fmt: skip
    g.reserved("h", 380.0, ["a", "c"])
    r = pol(g.records)
    if bad:
        only(r, "reservation_delayed")
    else:
        only(r)
