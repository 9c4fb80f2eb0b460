"""A partial log (its head deleted by a live service's event retention): every cut of a legal log
checks clean as ``partial``; checked as whole it is flagged, with a hint; a violation among the jobs
the log follows is still found; and the kinds a cut log cannot prove are listed as not judged,
never counted as passed in silence."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from goodput.cli.main import app
from goodput.sched.core.events import write_jsonl
from goodput.sched.sim.checker import KINDS, SAFETY_KINDS, UNJUDGED_IF_PARTIAL, check
from tests.sched.sim.test_checker import CAP, GEN_CAP, Log, clean_log, idle_log, job, legal_log, only, pol

runner = CliRunner()


def test_every_cut_of_a_legal_log_is_clean_as_partial_and_flagged_as_whole() -> None:
    records = clean_log().records
    for k in range(len(records)):
        cut = records[k:]
        r = check(cut, CAP, partial=True)
        only(r)
        assert r.partial and r.not_judged == UNJUDGED_IF_PARTIAL
        assert "partial log" in r.summary() and "not judged: reservation_delayed" in r.summary()
        started_before = {rec["job"] for rec in records[:k] if rec["event"] == "submitted"}
        named_after = {rec["job"] for rec in cut if "job" in rec}
        assert r.joined == len(started_before & named_after)
        whole = check(cut, CAP)
        if started_before & named_after:
            assert whole.violations["illegal_transition"] >= 1
            assert "`goodput sched check --partial`" in whole.examples[0]
            assert sum("--partial" in e for e in whole.examples) == 1  # said once, not on every line


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(20, 300), st.floats(0.0, 1.0))
def test_a_random_legal_log_cut_anywhere_has_no_safety_violation_as_partial(
    rng: random.Random, steps: int, where: float
) -> None:
    records = legal_log(rng, steps)
    cut = records[int(where * len(records)) :]
    r = check(cut, GEN_CAP, partial=True)
    assert not any(r.violations[k] for k in SAFETY_KINDS), (r.summary(), r.examples)


def test_a_violation_among_the_followed_jobs_is_still_found() -> None:
    g = Log()
    g.exit("old", 3, "finished").release("old", 3, ["a"]).e("finished", job="old")  # submitted before the cut
    g.at(1).submit("j1").start("j1", 1, ["a"])
    g.at(2).submit("j2").start("j2", 1, ["a"])  # a books 16 of its 8 GPUs
    r = check(g.records, CAP, partial=True)
    assert r.violations["overcommit"] == 1 and r.joined == 1, r.summary()
    g2 = Log().submit("j1").start("j1", 1, ["a"]).at(2).exit("j1", 1).release("j1", 1, ["a"])
    g2.at(3).start("j1", 2, ["a"])  # a start after the job's processes exited, never requeued
    assert check(g2.records, CAP, partial=True).violations["illegal_transition"] == 1


def test_the_kinds_a_partial_log_cannot_prove_are_not_judged_and_say_so() -> None:
    g = idle_log(None)  # a job left pending beside free GPUs: not work conserving in a whole log
    only(pol(g.records), "not_work_conserving")
    r = pol(g.records, partial=True)
    only(r)
    assert "not_work_conserving" in r.not_judged and set(r.not_judged) <= set(KINDS)
    # the per-job promises the log can prove are still judged
    h = job(Log(), "x", limit=10.0).start("x", 1, ["a"]).at(1000).commit("x", 1, 5.0)
    assert pol(h.records, partial=True).violations["over_limit"] == 1


def test_sched_check_partial_on_the_cli(tmp_path) -> None:
    records = clean_log().records
    path = tmp_path / "tail.jsonl"
    write_jsonl(records[len(records) // 2 :], path)
    caps = tmp_path / "cluster.json"
    caps.write_text(json.dumps({"pools": [{"name": "p", "nodes": 3, "gpus_per_node": 8}]}))
    whole = runner.invoke(app, ["sched", "check", str(path), "--nodes", "3"])
    assert whole.exit_code == 1 and "--partial" in whole.output, whole.output
    res = runner.invoke(app, ["sched", "check", str(path), "--nodes", "3", "--partial", "--json"])
    out = json.loads(res.stdout)
    assert out["partial"] is True and out["joined"] >= 1 and out["not_judged"] == list(UNJUDGED_IF_PARTIAL)
    assert out["violations"]["illegal_transition"] == 0, out
