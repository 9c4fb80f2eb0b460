"""The job state machine table: one edge per (state, trigger), everything reachable, nothing else legal."""

from __future__ import annotations

from collections import deque

import pytest

from goodput.sched.core import transitions as tr
from goodput.sched.core.model import TERMINAL, Job, JobState
from goodput.sched.core.transitions import EDGES, Edge, IllegalTransition, apply, edge, table_markdown

TRIGGERS = sorted({e.trigger for e in EDGES})


def job(state: JobState = JobState.PENDING, jid: str = "job-7") -> Job:
    return Job(id=jid, tenant="t", priority=0, nodes=1, gpus_per_node=8, submit_s=0.0, state=state)


def test_one_edge_per_state_and_trigger() -> None:
    keys = [(e.src, e.trigger) for e in EDGES]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    assert len(tr._TABLE) == len(EDGES)
    for e in EDGES:
        assert isinstance(e, Edge)
        assert edge(e.src, e.trigger) is e
        assert e.reason.strip(), f"{e.src.value} --{e.trigger}--> {e.dst.value} has no reason"


def test_every_state_reachable_from_pending() -> None:
    seen = {JobState.PENDING}
    todo = deque([JobState.PENDING])
    while todo:
        s = todo.popleft()
        for e in EDGES:
            if e.src is s and e.dst not in seen:
                seen.add(e.dst)
                todo.append(e.dst)
    assert seen == set(JobState)


def test_terminal_states_have_no_way_out_and_others_do() -> None:
    sources = {e.src for e in EDGES}
    assert sources.isdisjoint(TERMINAL)
    assert sources == set(JobState) - TERMINAL
    # every terminal state is entered by some edge
    assert {e.dst for e in EDGES} >= TERMINAL


def test_the_edges_the_design_rests_on() -> None:
    P, R, X = JobState.PENDING, JobState.RUNNING, JobState.PREEMPTING
    assert edge(P, "start").dst is R
    assert edge(R, "preempt").dst is X  # a preemption is a state, not a release
    assert edge(X, "gone").dst is P  # released only when observed gone
    assert edge(X, "gone_cancelled").dst is JobState.CANCELLED
    assert edge(X, "finish").dst is JobState.FINISHED
    assert edge(R, "fail_retry").dst is P and edge(R, "fail_final").dst is JobState.FAILED
    assert edge(R, "left").dst is P
    # a preempting job never fails of its exit (the exit is the leaving): only at its time limit
    # or with its infrastructure budget spent
    assert {e.trigger for e in EDGES if e.src is X and e.dst is JobState.FAILED} == {"timeout", "infra_final"}
    # nothing goes from pending to preempting or to a finish without running
    assert {e.dst for e in EDGES if e.src is P} == {R, JobState.CANCELLED}


@pytest.mark.parametrize("e", EDGES, ids=lambda e: f"{e.src.value}-{e.trigger}")
def test_apply_moves_along_every_edge(e: Edge) -> None:
    j = job(e.src)
    got = apply(j, e.trigger)
    assert got is e
    assert j.state is e.dst
    assert j.substate == e.dst.value  # default sub-state: the coarse state's name
    j2 = job(e.src)
    apply(j2, e.trigger, "custom")
    assert j2.substate == "custom"


ILLEGAL = [(s, t) for s in JobState for t in [*TRIGGERS, "bogus"] if (s, t) not in tr._TABLE]


def test_illegal_list_covers_the_named_examples() -> None:
    assert (JobState.PENDING, "finish") in ILLEGAL
    assert (JobState.FINISHED, "start") in ILLEGAL
    assert (JobState.PREEMPTING, "fail_retry") in ILLEGAL
    assert (JobState.PENDING, "preempt") in ILLEGAL


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL, ids=lambda x: getattr(x, "value", x))
def test_apply_refuses_every_edge_not_in_the_table(state: JobState, trigger: str) -> None:
    j = job(state, jid="victim-42")
    j.substate = "untouched"
    with pytest.raises(IllegalTransition) as err:
        apply(j, trigger)
    msg = str(err.value)
    assert "victim-42" in msg
    assert repr(state.value) in msg and repr(trigger) in msg
    # a refused move changes nothing
    assert j.state is state and j.substate == "untouched"


def test_edge_without_a_job_names_state_and_trigger() -> None:
    with pytest.raises(IllegalTransition, match=r"'pending'.*'finish'"):
        edge(JobState.PENDING, "finish")
    with pytest.raises(IllegalTransition, match=r"'finished'.*'start'"):
        edge(JobState.FINISHED, "start")


def test_illegal_transition_is_not_a_value_error() -> None:
    # a caller's bug, never confused with a bad input (SchedulerError is a ValueError)
    assert issubclass(IllegalTransition, RuntimeError)
    assert not issubclass(IllegalTransition, ValueError)


def test_table_markdown_lists_every_edge_once() -> None:
    md = table_markdown().splitlines()
    assert md[0].startswith("| from | trigger | to |")
    rows = md[2:]
    assert len(rows) == len(EDGES)
    for e, row in zip(EDGES, rows):
        assert row == f"| {e.src.value} | {e.trigger} | {e.dst.value} | {e.reason} |"
