"""``goodput sched sim`` and ``goodput sched check`` as a user runs them, and docs/SCHED.md's contracts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from goodput.cli.main import app
from goodput.sched.core.events import CONTRACT, read_jsonl
from goodput.sched.core.transitions import table_markdown
from goodput.sched.sim import formats, synthetic

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()

CSV = """id,tenant,submit_s,nodes,gpus_per_node,priority,duration_s,limit_s,ckpt_interval_s,ckpt_write_s,restart_s,grace_s,spot,extra
low-a,a,0,2,8,0,7200,7200,600,30,60,120,0,ignored
low-b,b,0,2,8,0,7200,7200,0,0,60,30,1,ignored
high,a,1800,2,8,5,600,600,0,0,30,30,0,ignored
small,b,1900,1,1,1,300,300,0,0,10,30,0,ignored
"""

CLUSTER = {
    "pools": [
        {"name": "od", "kind": "on-demand", "nodes": 3, "gpus_per_node": 8, "price_per_gpu_hour": 4.0},
        {
            "name": "spot",
            "kind": "spot",
            "nodes": 1,
            "gpus_per_node": 8,
            "price_per_gpu_hour": 1.6,
            "reclaim_per_node_hour": 0.3,
        },
    ],
    "events": [{"t": 3000, "kind": "node_loss", "pool": "od", "nodes": 1, "notice_s": 0, "return_s": 3600}],
}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    w = tmp_path / "jobs.csv"
    w.write_text(CSV)
    c = tmp_path / "cluster.json"
    c.write_text(json.dumps(CLUSTER))
    return w, c


def test_sim_json_events_and_plots(tmp_path):
    w, c = _files(tmp_path)
    ev = tmp_path / "ev.jsonl"
    res = runner.invoke(
        app,
        [
            "sched",
            "sim",
            "--workload",
            str(w),
            "--cluster",
            str(c),
            "--policy",
            "kueue-victims",
            "--policy",
            "goodput",
            "--events",
            str(ev),
            "--plot",
            str(tmp_path / "plots"),
            "--json",
            "--workers",
            "1",
            "--ledger",
            str(tmp_path / "ledger.csv"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["policies"]) == {"kueue-victims", "goodput"}
    for m in out["policies"].values():
        for key in ("goodput", "lost_gpu_hours", "wait_p50_s", "wait_p99_s", "utilization", "violations"):
            assert isinstance(m[key], (int, float)), key
        for key in ("useful_per_capacity", "lost_gpu_hours_total", "preemption_decisions", "victims"):
            assert isinstance(m[key], (int, float)), key
        assert 0 < m["useful_per_capacity"] <= 1 and set(m["tenant_shares"]) == {"a", "b"}
        assert m["window"]["end_s"] == 1900.0  # the last arrival
        assert m["violations"] == 0 and m["jobs"] == {"finished": 4}
    assert out["events_policy"] == "goodput"  # ours, though given second
    recs = read_jsonl(ev)
    kinds = {r["event"] for r in recs}
    assert {"submitted", "started", "preempt_requested", "released", "requeued", "finished", "node_lost"} <= kinds
    assert kinds - CONTRACT <= {"cancelled", "commit_rejected", "node_reclaim_notice", "node_up", "reserved"}
    pre = [r for r in recs if r["event"] == "preempt_requested" and r["victim_of"] == "high"]
    assert pre and all("lost_s" in r and "candidates" in r for r in pre)
    for p in out["plots"]:
        assert Path(p).stat().st_size > 1000
    rows = (tmp_path / "ledger.csv").read_text().splitlines()
    assert rows[0].startswith("job,tenant,allocated_gpu_h,useful_gpu_h") and len(rows) == 5
    # the checker agrees from the command line
    chk = runner.invoke(app, ["sched", "check", str(ev), "--cluster", str(c), "--json"])
    assert chk.exit_code == 0, chk.output
    assert json.loads(chk.output)["total"] == 0


def test_jobs_no_pool_holds_are_an_error_listing_their_ids(tmp_path):
    w, c = _files(tmp_path)
    w.write_text(CSV + "huge,a,0,9,8,0,60,,,,,,0\nwide,b,0,1,16,0,60,,,,,,0\n")
    res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--cluster", str(c)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "2 jobs fit no pool" in text and "huge, wide" in text, text
    assert "--skip-unplaceable" in text
    ok = runner.invoke(
        app, ["sched", "sim", "--workload", str(w), "--cluster", str(c), "--skip-unplaceable", "--json", "--policy",
              "goodput"]
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.output[ok.output.index("{") :])
    assert out["skipped_unplaceable"] == ["huge", "wide"]
    assert out["policies"]["goodput"]["jobs"] == {"finished": 4}
    assert any("2 jobs fit no pool" in n for n in out["notes"])


def test_a_row_the_operator_refuses_is_named_by_file_line_and_column(tmp_path):
    """The cluster's governance checks each CSV row where it stands, as a malformed cell is."""
    w, c = _files(tmp_path)
    cluster = dict(CLUSTER, tenants=[{"name": "a", "max_priority": 3}], limits={"max_grace_s": 100})
    c.write_text(json.dumps(cluster))
    cases = [
        ("high", "priority", "above tenant 'a''s max_priority 3"),  # line 4 asks for priority 5
        ("low-a", "grace_s", "above the cluster's max_grace_s 100"),  # line 2: grace 120
    ]
    for jid, column, why in cases:
        rows = CSV.splitlines()
        line = next(i for i, r in enumerate(rows, 1) if r.startswith(jid + ","))
        if column == "priority":  # keep only the row under test out of bounds
            rows = [r.replace(",120,0,ignored", ",30,0,ignored") for r in rows]
        w.write_text("\n".join(rows) + "\n")
        res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--cluster", str(c), "--policy", "goodput"])
        text = "".join(res.output.split())  # rich may wrap a long path anywhere
        want = "".join(f"{w}:{line}: column {column!r}".split())
        assert res.exit_code != 0 and want in text and "".join(why.split()) in text, res.output
    # without a cluster file the defaults of limits apply (max_grace_s 600)
    w.write_text(CSV.replace(",120,0,ignored", ",1e9,0,ignored"))
    res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--policy", "goodput"])
    text = "".join(res.output.split())
    assert res.exit_code != 0 and f"{w}:2:column'grace_s'" in text and "max_grace_s600" in text, res.output


def test_the_synthetic_workloads_misfits_are_listed_not_fatal():
    """Its gangs are capped at --nodes (16), the on-demand pool has 12: those are left out, by id."""
    res = runner.invoke(app, ["sched", "sim", "--jobs", "400", "--nodes", "16", "--policy", "goodput", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{") :])
    jobs = {j.id: j for j in synthetic.synthetic(400, nodes=16)}
    assert out["skipped_unplaceable"] and all(jobs[i].nodes > 12 for i in out["skipped_unplaceable"])
    assert sum(out["policies"]["goodput"]["jobs"].values()) == 400 - len(out["skipped_unplaceable"])


def test_one_workload_at_a_time(tmp_path):
    w, _ = _files(tmp_path)
    res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--philly", str(tmp_path)])
    assert res.exit_code == 2 and "give one workload, not --workload and --philly" in " ".join(res.output.split())


def test_ids_with_spaces_are_refused(tmp_path):
    w, c = _files(tmp_path)
    w.write_text(CSV.replace("small,b,1900", " small ,b,1900"))
    res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--cluster", str(c)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "jobs.csv:5: column 'id'" in text and "surrounding spaces" in text


def test_philly_replay_from_the_command_line(tmp_path):
    (tmp_path / "philly.csv").write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        + "".join(f"2017-10-01 0{h}:00:00,{600 * (h + 1)}.0,{(1, 2, 8, 16)[h % 4]},0,vc{h % 3}\n" for h in range(8))
    )
    res = runner.invoke(
        app, ["sched", "sim", "--philly", str(tmp_path), "--gpus", "32", "--philly-days", "1", "--json", "--workers",
              "1"]
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert "Philly 2017 replay: 8 jobs" in out["notes"][0] and "32 GPUs" in out["notes"][0]
    for m in out["policies"].values():
        assert m["jobs"] == {"finished": 8} and m["violations"] == 0
        assert set(m["tenant_shares"]) == {"vc0", "vc1", "vc2"}


def test_sim_deterministic_with_a_cluster_file(tmp_path):
    w, c = _files(tmp_path)
    outs = []
    for i in range(2):
        ev = tmp_path / f"ev{i}.jsonl"
        res = runner.invoke(
            app, ["sched", "sim", "--workload", str(w), "--cluster", str(c), "--policy", "goodput", "--events", str(ev)]
        )
        assert res.exit_code == 0, res.output
        outs.append(ev.read_text())
    assert outs[0] == outs[1]


def test_bad_workload_names_line_and_column(tmp_path):
    w, c = _files(tmp_path)
    w.write_text(CSV.replace("high,a,1800,2,8", "high,a,1800,two,8"))
    res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--cluster", str(c)])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "jobs.csv:4" in text and "'nodes'" in text


def test_unknown_policy_and_bad_cluster(tmp_path):
    w, c = _files(tmp_path)
    res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--cluster", str(c), "--policy", "nope"])
    assert res.exit_code == 2 and "unknown policy" in res.output
    c.write_text(json.dumps({"pools": [{"name": "x", "kind": "cheap", "nodes": 1, "gpus_per_node": 8}]}))
    res = runner.invoke(app, ["sched", "sim", "--workload", str(w), "--cluster", str(c)])
    assert res.exit_code == 2 and "pools[0].kind" in " ".join(res.output.split())


def test_check_counts_violations(tmp_path):
    log = tmp_path / "bad.jsonl"
    recs = [
        {"t": 0, "event": "submitted", "job": "a", "tenant": "t", "priority": 0, "nodes": 1, "gpus_per_node": 8},
        {"t": 0, "event": "submitted", "job": "b", "tenant": "t", "priority": 0, "nodes": 1, "gpus_per_node": 8},
        {"t": 1, "event": "started", "job": "a", "epoch": 1, "pool": "od", "nodes": ["od-00000"], "gpus_per_node": 8},
        {"t": 2, "event": "started", "job": "b", "epoch": 1, "pool": "od", "nodes": ["od-00000"], "gpus_per_node": 8},
    ]
    for r in recs[2:]:
        r["resume_from_s"] = 0.0
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    c = tmp_path / "c.json"
    c.write_text(json.dumps(CLUSTER))
    res = runner.invoke(app, ["sched", "check", str(log), "--cluster", str(c), "--json"])
    assert res.exit_code == 1
    assert json.loads(res.output)["violations"]["overcommit"] == 1


def test_sim_db_persists_and_refuses_a_used_store(tmp_path):
    w, c = _files(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    args = ["sched", "sim", "--workload", str(w), "--cluster", str(c), "--policy", "goodput", "--db", url]
    assert runner.invoke(app, args).exit_code == 0
    from goodput.sched.live.store import open_store

    with open_store(url) as store:
        snap = store.load()
    assert {j.state.value for j in snap.jobs.values()} == {"finished"} and len(snap.jobs) == 4
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "already holds" in res.output


def test_docs_state_the_table_and_the_columns():
    doc = (ROOT / "docs" / "SCHED.md").read_text()
    assert table_markdown() in doc
    for col in formats.REQUIRED_COLUMNS + formats.OPTIONAL_COLUMNS:
        assert re.search(rf"\| `{col}` \|", doc), col
    for event in CONTRACT:
        assert f"`{event}`" in doc, event
    for key in ("tick_p50_ms", "tick_p99_ms", "growth_100k_over_10k", "speedup_vs_full_sort", "sim_events_per_s"):
        assert key in doc


def test_check_takes_a_live_services_slots(tmp_path: Path) -> None:
    """A live service's log names its local slots; `check --nodes/--gpus-per-node` knows them."""
    from goodput.sched.core.executor import ManualClock, RecordingExecutor
    from goodput.sched.core.model import Job
    from goodput.sched.core.scheduler import Scheduler
    from goodput.sched.live.service import local_pools

    clock = ManualClock(0.0)
    s = Scheduler(local_pools(2, 1), clock=clock, executor=RecordingExecutor())
    s.submit(Job("a", "t", 0, 2, 1, submit_s=0.0, limit_s=10.0))
    s.tick()
    clock.t = 5.0
    s.report_exit("a", 1, "finished")
    log = tmp_path / "ev.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in s.log.records))
    ok = runner.invoke(app, ["sched", "check", str(log), "--nodes", "2", "--gpus-per-node", "1"])
    assert ok.exit_code == 0 and "no violations" in ok.output, ok.output
    wrong = runner.invoke(app, ["sched", "check", str(log)])  # the synthetic cluster has no such slots
    assert wrong.exit_code == 1 and "not_all_or_nothing" in wrong.output
    assert "not in the cluster checked against" in " ".join(wrong.output.split())  # says why, not just what


def test_sim_seeds_reports_each_policys_mean_and_range_over_the_seeds() -> None:
    args = ["sched", "sim", "--jobs", "150", "--nodes", "16", "--policy", "goodput", "--policy", "spot-by-price"]
    res = runner.invoke(app, [*args, "--seeds", "2", "--seed", "5", "--workers", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert sorted(out["seeds"]) == ["5", "6"]
    for name in ("goodput", "spot-by-price"):
        per = [out["seeds"][s][name]["useful_per_capacity"] for s in ("5", "6")]
        got = out["summary"][name]["useful_per_capacity"]
        assert got["mean"] == sum(per) / 2 and got["min"] == min(per) and got["max"] == max(per)
    # the best of each seed is counted once per seed (ties count for each of the tied)
    best = [max(out["seeds"][s][n]["useful_per_capacity"] for n in ("goodput", "spot-by-price")) for s in ("5", "6")]
    assert sum(out["summary"][n]["useful_per_capacity"]["best_in"] for n in ("goodput", "spot-by-price")) >= len(best)
    # each seed is its own run: the same as a single run with that seed
    one = runner.invoke(app, [*args, "--seed", "6", "--workers", "1", "--json"])
    assert (
        json.loads(one.stdout)["policies"]["goodput"]["useful_per_capacity"]
        == out["seeds"]["6"]["goodput"]["useful_per_capacity"]
    )
    # a seed table is rendered, and one-run outputs are refused beside --seeds
    table = runner.invoke(app, [*args, "--seeds", "2", "--workers", "1"])
    assert table.exit_code == 0 and "over 2 seeds" in table.output
    bad = runner.invoke(app, [*args, "--seeds", "2", "--events", "x.jsonl"])
    assert bad.exit_code == 2 and "--seeds" in bad.output


def test_sim_seeds_says_when_no_run_depended_on_the_seed(tmp_path) -> None:
    # a workload file and a cluster file, no generated failures or reclaims: every seed is one run
    w, c = _files(tmp_path)
    res = runner.invoke(
        app, ["sched", "sim", "--workload", str(w), "--cluster", str(c), "--seeds", "2", "--workers", "1", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["seeds_alike"] is True and any(
        "nothing in this comparison depends on the seed" in n for n in out["notes"]
    )
    synth = runner.invoke(
        app, ["sched", "sim", "--jobs", "150", "--nodes", "16", "--policy", "goodput", "--seeds", "2", "--json"]
    )
    assert json.loads(synth.stdout)["seeds_alike"] is False


def test_seeds_summary_counts_the_seeds_behind_each_mean() -> None:
    from goodput.sched.sim.compare import PolicyResult
    from goodput.sched.sim.report import seeds_summary

    def res(name: str, upc: float, ev: float = 1.0) -> PolicyResult:
        m = {"useful_per_capacity": upc, "lost_gpu_hours_total": 1.0, "victims_per_decision": 1.0}
        m |= {"max_evictions_of_one_job": ev, "violations": 0}
        return PolicyResult(name, m, {}, [], [])

    nan = float("nan")
    per = {0: [res("a", 0.5), res("b", nan, nan)], 1: [res("a", 0.4), res("b", 0.6)], 2: [res("a", 0.3), res("b", nan)]}
    s = seeds_summary(per)
    assert s["b"]["useful_per_capacity"]["n"] == 1 and s["a"]["useful_per_capacity"]["n"] == 3
    assert s["b"]["max_evictions_of_one_job"] == 1  # a NaN does not crash the summary
