import csv
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodput.plan.failures import LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_UNEXPECTED
from goodput.sched.core.ids import ID_RE
from goodput.sched.core.model import Checkpointing, Job, Pool, PoolKind, RetryPolicy
from goodput.sched.sim import formats, interruptions, synthetic, traces

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"
TRACES = SHARED / "data" / "traces"
ACME_CSV = TRACES / "acme-summary" / "cluster_summary.csv"
ALIBABA = TRACES / "alibaba-gpu-v2023"
PHILLY = TRACES / "philly-pollux"
SKYPILOT = TRACES / "skypilot-spot" / "preemption"


def need(path: Path):
    return pytest.mark.skipif(
        not path.exists(), reason=f"{path} is absent: the shared trace data is not part of a clone"
    )


HEADER = "id,tenant,submit_s,nodes,gpus_per_node,priority,duration_s"
GOOD = "a,t00,0,1,8,0,100"


def write(tmp_path: Path, text: str, name: str = "jobs.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ------------------------------------------------------------------------------------------
# CSV
# ------------------------------------------------------------------------------------------


def _fields(j: Job) -> tuple:
    c = j.ckpt
    return (
        j.id,
        j.tenant,
        j.submit_s,
        j.nodes,
        j.gpus_per_node,
        j.priority,
        j.duration_s,
        j.limit_s,
        c.interval_s,
        c.write_s,
        c.stall_s,
        c.restart_s,
        c.grace_s,
        j.spot,
        j.retry.max_failures,
        j.seq,
        j.eligible_s,
    )


def test_minimal_csv_takes_defaults(tmp_path):
    p = write(tmp_path, f"{HEADER},extra\n{GOOD},whatever\nb,t01,5.5,2,4,3,60,\n")
    a, b = formats.read_workload_csv(p)
    assert (a.id, a.nodes, a.gpus_per_node, a.duration_s, a.limit_s) == ("a", 1, 8, 100.0, 100.0)
    assert a.ckpt == Checkpointing(0.0, 0.0, 0.0, 0.0, 30.0) and a.retry.max_failures == 3 and not a.spot
    assert (b.seq, b.submit_s, b.eligible_s, b.priority, b.gpus) == (1, 5.5, 5.5, 3, 8)


def test_empty_optional_cells_take_defaults_and_blank_lines_are_skipped(tmp_path):
    cols = ",".join(formats.COLUMNS)
    p = write(tmp_path, f" {cols.replace(',', ' , ')} \n\na,t,0,1,1,0,50,,,,,,,,\n\n")
    (j,) = formats.read_workload_csv(p)
    assert j.limit_s == 50.0 and j.ckpt.grace_s == 30.0 and j.retry.max_failures == 3 and j.spot is False


def test_round_trip_synthetic(tmp_path):
    jobs = synthetic.synthetic(500, seed=3)
    p = tmp_path / "w.csv"
    formats.write_workload_csv(jobs, p)
    assert [_fields(j) for j in formats.read_workload_csv(p)] == [_fields(j) for j in jobs]
    with open(p, newline="") as f:
        assert next(csv.reader(f)) == list(formats.COLUMNS)


_text = st.from_regex(ID_RE, fullmatch=True)  # ids and tenants: the documented character set
_nonneg = st.floats(0, 1e9, allow_nan=False, allow_infinity=False)
_pos = st.floats(1e-6, 1e9, allow_nan=False, allow_infinity=False)


@st.composite
def _jobs(draw):
    n = draw(st.integers(0, 8))
    ids = draw(st.lists(_text, min_size=n, max_size=n, unique=True))
    out = []
    for i, jid in enumerate(ids):
        sub = draw(_nonneg)
        out.append(
            Job(
                id=jid,
                tenant=draw(_text),
                priority=draw(st.integers(-5, 10**12)),
                nodes=draw(st.integers(1, 4096)),
                gpus_per_node=draw(st.integers(1, 16)),
                submit_s=sub,
                duration_s=draw(_pos),
                limit_s=draw(_pos),
                spot=draw(st.booleans()),
                ckpt=Checkpointing(draw(_nonneg), draw(_nonneg), draw(_nonneg), draw(_nonneg), draw(_nonneg)),
                retry=RetryPolicy(max_failures=draw(st.integers(0, 100))),
                seq=i,
                eligible_s=sub,
            )
        )
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_jobs())
def test_round_trip_property(jobs):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "w.csv"
        formats.write_workload_csv(jobs, p)
        assert [_fields(j) for j in formats.read_workload_csv(p)] == [_fields(j) for j in jobs]


BAD = [
    ("nodes", "x"),
    ("nodes", "0"),
    ("nodes", "1.5"),
    ("gpus_per_node", "-8"),
    ("submit_s", "-1"),
    ("submit_s", "nan"),
    ("submit_s", "abc"),
    ("duration_s", "0"),
    ("duration_s", "inf"),
    ("priority", "high"),
    ("priority", "0.5"),
    ("limit_s", "0"),
    ("limit_s", "-inf"),
    ("ckpt_interval_s", "-1"),
    ("ckpt_write_s", "NaN"),
    ("ckpt_stall_s", "-0.5"),
    ("restart_s", "soon"),
    ("grace_s", "inf"),
    ("spot", "2"),
    ("spot", "yes"),
    ("max_failures", "-1"),
    ("max_failures", "2.5"),
    ("id", " "),
    ("tenant", ""),
]


@pytest.mark.parametrize(("col", "value"), BAD)
def test_bad_value_names_line_and_column(tmp_path, col, value):
    optional = dict(zip(formats.OPTIONAL_COLUMNS, ("10", "600", "5", "0.1", "60", "30", "1", "3")))
    good = dict(zip(HEADER.split(","), GOOD.split(","))) | optional
    cols = list(good)
    bad = dict(good, id="b") | {col: value}
    text = ",".join(cols) + "\n" + ",".join(good[c] for c in cols) + "\n" + ",".join(bad[c] for c in cols) + "\n"
    p = write(tmp_path, text)
    with pytest.raises(formats.WorkloadError) as e:
        formats.read_workload_csv(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: column {col!r}: "), msg
    if value.strip():
        assert repr(value) in msg


def test_error_message_shape(tmp_path):
    p = write(tmp_path, f"{HEADER}\n" + "\n".join(f"j{i},t,0,1,1,0,1" for i in range(5)) + "\nz,t,0,x,1,0,1\n")
    with pytest.raises(formats.WorkloadError, match=r"jobs\.csv:7: column 'nodes': expected an int >= 1, got 'x'$"):
        formats.read_workload_csv(p)


def test_a_record_spanning_lines_is_named_by_its_first_line(tmp_path):
    """A quoted cell (an exporter's own column) may span lines: the error names the line where
    the record starts, not where the reader stopped; and the records after it keep their lines."""
    p = write(tmp_path, f'{HEADER},note\nj0,t,0,1,1,0,1,"two\nlines"\nz,t,0,x,1,0,1,"a\nb\nc"\n')
    with pytest.raises(formats.WorkloadError, match=r"jobs\.csv:4: column 'nodes'"):
        formats.read_workload_csv(p)
    p = write(tmp_path, f'{HEADER},note\nj0,t,0,1,1,0,1,"two\nlines"\nj0,t,0,1,1,0,1,x\n')
    with pytest.raises(formats.WorkloadError, match=r":4: column 'id': duplicate id 'j0' \(first on line 2\)"):
        formats.read_workload_csv(p)


def test_a_row_its_cluster_refuses_is_named_by_line_and_column(tmp_path):
    from goodput.sched.core.governance import Governance

    gov = Governance.from_obj([{"name": "t", "max_priority": 1}], {"max_restart_s": 100})
    ok = f"{HEADER},restart_s\nj0,t,0,1,1,1,1,100\n"
    assert [j.id for j in formats.read_workload_csv(write(tmp_path, ok), gov)] == ["j0"]
    p = write(tmp_path, ok + "j1,t,0,1,1,2,1,0\n")
    with pytest.raises(formats.WorkloadError, match=r"jobs\.csv:3: column 'priority': job 'j1': priority 2"):
        formats.read_workload_csv(p, gov)
    p = write(tmp_path, ok + "j1,t,0,1,1,0,1,101\n")
    with pytest.raises(formats.WorkloadError, match=r"jobs\.csv:3: column 'restart_s': .*max_restart_s 100"):
        formats.read_workload_csv(p, gov)
    assert len(formats.read_workload_csv(p)) == 2  # without governance: read as before


@pytest.mark.parametrize("col", formats.REQUIRED_COLUMNS)
def test_missing_column(tmp_path, col):
    cols = [c for c in HEADER.split(",") if c != col]
    vals = [v for c, v in zip(HEADER.split(","), GOOD.split(",")) if c != col]
    p = write(tmp_path, ",".join(cols) + "\n" + ",".join(vals) + "\n")
    with pytest.raises(formats.WorkloadError, match=rf":1: missing required column '{col}'"):
        formats.read_workload_csv(p)


def test_duplicate_id_names_both_lines(tmp_path):
    p = write(tmp_path, f"{HEADER}\n{GOOD}\nb,t,0,1,1,0,1\n{GOOD}\n")
    with pytest.raises(formats.WorkloadError, match=r":4: column 'id': duplicate id 'a' \(first on line 2\)"):
        formats.read_workload_csv(p)


@pytest.mark.parametrize("bad", [" a ", "a ", " a", "a b", "a/b", "-a", ".a", "x" * 129, "caf\u00e9", "a,b"])
def test_ids_are_validated(tmp_path, bad):
    """` a ` and `a` were two jobs; an id is now 1-128 of [A-Za-z0-9._:@-] starting alphanumeric."""
    cell = f'"{bad}"' if "," in bad else bad
    p = write(tmp_path, f"{HEADER}\n{GOOD}\n{cell},t,0,1,1,0,1\n")
    with pytest.raises(formats.WorkloadError, match=r"jobs\.csv:3: column 'id': ") as e:
        formats.read_workload_csv(p)
    assert "A-Za-z0-9._:@-" in str(e.value)
    p = write(tmp_path, f"{HEADER}\n{GOOD}\nb,{cell},0,1,1,0,1\n")
    with pytest.raises(formats.WorkloadError, match=r"jobs\.csv:3: column 'tenant': "):
        formats.read_workload_csv(p)


def test_good_ids_pass(tmp_path):
    ids = ["a", "A0.b_c:d@e-f", "x" * 128, "9"]
    p = write(tmp_path, HEADER + "\n" + "".join(f"{i},t-{k},0,1,1,0,1\n" for k, i in enumerate(ids)))
    assert [j.id for j in formats.read_workload_csv(p)] == ids


def test_too_many_cells_and_empty_file(tmp_path):
    with pytest.raises(formats.WorkloadError, match=r":2: 8 cells but the header has 7"):
        formats.read_workload_csv(write(tmp_path, f"{HEADER}\n{GOOD},surprise\n"))
    with pytest.raises(formats.WorkloadError, match=r":1: empty file"):
        formats.read_workload_csv(write(tmp_path, ""))


# ------------------------------------------------------------------------------------------
# Cluster JSON
# ------------------------------------------------------------------------------------------


def _cluster_obj():
    return {
        "pools": [
            {"name": "od", "kind": "on-demand", "nodes": 4, "gpus_per_node": 8, "price_per_gpu_hour": 4.0, "x": 1},
            {
                "name": "sp",
                "kind": "spot",
                "nodes": 2,
                "gpus_per_node": 4,
                "price_per_gpu_hour": 1.6,
                "reclaim_per_node_hour": 0.5,
            },
        ],
        "events": [
            {"t": 50, "kind": "reclaim", "pool": "sp", "nodes": 2, "notice_s": 120, "return_s": 600},
            {"t": 10, "kind": "node_loss", "pool": "od", "nodes": 1},
            {"t": 50, "kind": "node_loss", "pool": "od", "nodes": 4, "return_s": None, "why": "test"},
        ],
    }


def test_cluster_read_sorts_events_stably_and_round_trips(tmp_path):
    p = write(tmp_path, json.dumps(_cluster_obj()), "cluster.json")
    c = formats.read_cluster_json(p)
    assert [p_.name for p_ in c.pools] == ["od", "sp"] and c.pools[1].kind is PoolKind.SPOT
    assert c.pools[0].reclaim_per_node_hour == 0.0 and c.pools[1].reclaim_per_node_hour == 0.5
    assert [(e.t, e.kind, e.pool) for e in c.events] == [
        (10.0, "node_loss", "od"),
        (50.0, "reclaim", "sp"),
        (50.0, "node_loss", "od"),
    ]
    assert c.events[1] == formats.ClusterEvent(50.0, "reclaim", "sp", 2, 120.0, 600.0, 0)
    assert c.events[0].notice_s == 0.0 and c.events[0].return_s is None
    q = tmp_path / "again.json"
    formats.write_cluster_json(c, q)
    assert formats.read_cluster_json(q) == c
    assert c.node_names("sp") == ["sp-00000", "sp-00001"]
    cap = c.capacity()
    assert len(cap) == 6 and cap["od-00003"] == 8 and cap["sp-00001"] == 4 and c.gpus == 40
    with pytest.raises(KeyError):
        c.node_names("nope")


def test_cluster_round_trips_failure_events(tmp_path):
    c = synthetic.synthetic_cluster(64, 8)
    c = formats.Cluster(c.pools, interruptions.llama3_failures(c, 400 * 86400, seed=1))
    assert {e.kind for e in c.events} == {"node_loss", "job_failure"}
    p = tmp_path / "c.json"
    formats.write_cluster_json(c, p)
    assert formats.read_cluster_json(p) == c


def _set(path: str, value):
    def mutate(obj):
        *keys, last = path.split(".")
        cur = obj
        for k in keys:
            cur = cur[int(k)] if k.isdigit() else cur[k]
        if value is KeyError:
            del cur[int(last) if last.isdigit() else last]
        else:
            cur[int(last) if last.isdigit() else last] = value

    return mutate


CLUSTER_BAD = [
    ("pools.1.gpus_per_node", 0, "pools[1].gpus_per_node: expected an int >= 1"),
    ("pools.0.nodes", 2.5, "pools[0].nodes: expected an int >= 1"),
    ("pools.0.nodes", True, "pools[0].nodes"),
    ("pools.0.kind", "preemptible", "pools[0].kind: expected 'on-demand' or 'spot'"),
    ("pools.1.name", "od", "pools[1].name: duplicate pool name 'od' (also pools[0])"),
    ("pools.1.name", "", "pools[1].name"),
    ("pools.1.price_per_gpu_hour", -1, "pools[1].price_per_gpu_hour"),
    ("pools.0.price_per_gpu_hour", KeyError, "pools[0].price_per_gpu_hour: required key is missing"),
    ("pools.1.reclaim_per_node_hour", "lots", "pools[1].reclaim_per_node_hour"),
    ("pools", [], "pools: expected a non-empty list"),
    ("pools", KeyError, "pools: required key is missing"),
    ("events", {}, "events: expected a list"),
    ("events.0.pool", "gone", "events[0].pool: no pool named 'gone'"),
    ("events.0.nodes", 3, "events[0].nodes: 3 nodes, but pool 'sp' has 2"),
    ("events.1.nodes", 0, "events[1].nodes"),
    ("events.0.t", -1, "events[0].t"),
    ("events.2.t", KeyError, "events[2].t: required key is missing"),
    ("events.1.kind", "meteor", "events[1].kind"),
    ("events.0.return_s", 0, "events[0].return_s"),
    ("events.0.notice_s", "soon", "events[0].notice_s"),
    ("events.1", 7, "events[1]: expected an object"),
]


@pytest.mark.parametrize(("path", "value", "msg"), CLUSTER_BAD)
def test_cluster_errors_name_the_key(tmp_path, path, value, msg):
    obj = _cluster_obj()
    _set(path, value)(obj)
    p = write(tmp_path, json.dumps(obj), "cluster.json")
    with pytest.raises(formats.WorkloadError) as e:
        formats.read_cluster_json(p)
    assert str(e.value).startswith(f"{p}: {msg}"), str(e.value)


def test_cluster_not_json_and_non_finite(tmp_path):
    with pytest.raises(formats.WorkloadError, match=r"cluster\.json:2: not JSON"):
        formats.read_cluster_json(write(tmp_path, '{"pools":\n [,]}', "cluster.json"))
    obj = _cluster_obj()
    text = json.dumps(obj).replace('"t": 50', '"t": NaN', 1)
    with pytest.raises(formats.WorkloadError, match=r"events\[0\]\.t: expected a finite number"):
        formats.read_cluster_json(write(tmp_path, text, "cluster.json"))
    with pytest.raises(formats.WorkloadError, match=r"\(top\): expected an object"):
        formats.read_cluster_json(write(tmp_path, "[1]", "cluster.json"))


# ------------------------------------------------------------------------------------------
# Synthetic workload and its calibration
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big():
    return synthetic.synthetic()  # 100k jobs: the default the simulator runs


def test_synthetic_default_size_and_shapes(big):
    assert len(big) == 100_000 and len({j.id for j in big}) == 100_000
    assert [j.seq for j in big[:3]] == [0, 1, 2] and big[0].submit_s == 0.0
    sub = np.array([j.submit_s for j in big])
    assert np.all(np.diff(sub) >= 0) and all(j.eligible_s == j.submit_s for j in big[:100])
    for j in big:
        assert j.nodes == 1 and j.gpus_per_node in (1, 2, 4, 8) or j.nodes in (2, 4, 8, 16, 32, 64, 128)
        assert j.nodes == 1 or j.gpus_per_node == 8
        assert 1.0 <= j.duration_s <= synthetic.RUN_CAP_S and j.limit_s >= j.duration_s
        assert j.priority in (0, 1, 2, 3)
    assert max(j.gpus for j in big) == 1024


def test_synthetic_calibration_matches_its_targets(big):
    t = synthetic.synthetic_targets()
    d = np.array([j.duration_s for j in big])
    g = np.array([j.gpus for j in big])
    assert np.median(d) == pytest.approx(t["med_run_s"], rel=0.15)
    assert d.mean() == pytest.approx(t["avg_run_s"], rel=0.15)
    assert np.median(g) == t["med_gpus"] == 1
    assert g.mean() == pytest.approx(t["avg_gpus"], rel=0.15)
    span = big[-1].submit_s
    assert float(np.sum(d * g)) / (span * 2048 * 8) == pytest.approx(0.9, rel=0.1)


def test_synthetic_tenants_priorities_and_checkpoints(big):
    tenants = [j.tenant for j in big]
    counts = {k: tenants.count(k) for k in sorted(set(tenants))}
    assert list(counts) == [f"t{i:02d}" for i in range(16)]
    assert counts["t00"] > 1.6 * counts["t01"] and counts["t00"] > 5 * counts["t15"]
    prio = np.array([j.priority for j in big])
    gang = np.array([j.nodes > 1 for j in big])
    assert np.mean(prio[~gang] <= 1) > 0.8 and prio[gang].mean() > prio[~gang].mean() + 0.8
    dur = np.array([j.duration_s for j in big])
    ck = np.array([j.ckpt.interval_s > 0 for j in big])
    assert np.mean(ck[dur < 1800]) < 0.15 and np.mean(ck[dur >= 1800]) > 0.85
    for j in big:
        c = j.ckpt
        assert c.interval_s == 0 or 600 <= c.interval_s <= 3600
        assert 10 <= c.write_s <= 180 and 0.01 * c.write_s - 0.01 <= c.stall_s <= 0.1 * c.write_s + 0.01
        assert 60 <= c.restart_s <= 600 and 30 <= c.grace_s <= 300
    assert np.mean([j.spot for j, e in zip(big, ck) if e]) == pytest.approx(0.4, abs=0.03)
    assert np.mean([j.spot for j, e in zip(big, ck) if not e]) == pytest.approx(0.2, abs=0.03)
    fits = [j.ckpt.fits_grace() for j in big if j.ckpt.interval_s > 0]
    assert 0.02 < 1 - np.mean(fits) < 0.98  # some fit their write in grace, some do not
    w1 = np.mean([j.ckpt.write_s for j in big if j.gpus == 1])
    w_big = np.mean([j.ckpt.write_s for j in big if j.nodes >= 32])
    assert w_big > 4 * w1


def test_synthetic_is_deterministic():
    a, b, c = synthetic.synthetic(3000, seed=7), synthetic.synthetic(3000, seed=7), synthetic.synthetic(3000, seed=8)
    assert [_fields(j) for j in a] == [_fields(j) for j in b]
    assert [_fields(j) for j in a] != [_fields(j) for j in c]


def test_synthetic_small_cluster_shapes_fit():
    jobs = synthetic.synthetic(2000, nodes=16, gpus_per_node=4, tenants=3, seed=1)
    assert max(j.nodes for j in jobs) <= 16 and max(j.gpus_per_node for j in jobs) <= 4
    assert {j.tenant for j in jobs} == {"t00", "t01", "t02"}
    assert synthetic.synthetic(0) == []


def test_lognormal_fit_hits_capped_mean():
    mu, sigma = synthetic.lognormal_fit(123.0, 1337.0, synthetic.RUN_CAP_S)
    assert mu == pytest.approx(math.log(123.0))
    assert sigma > math.sqrt(2 * math.log(1337.0 / 123.0))
    x = np.minimum(np.random.default_rng(0).lognormal(mu, sigma, 400_000), synthetic.RUN_CAP_S)
    assert x.mean() == pytest.approx(1337.0, rel=0.05)
    assert synthetic.lognormal_fit(100.0, 200.0, math.inf) == (math.log(100.0), math.sqrt(2 * math.log(2.0)))


def test_synthetic_cluster():
    c = synthetic.synthetic_cluster()
    od, sp = c.pools
    assert (od.name, od.kind, od.nodes, od.gpus_per_node, od.price_per_gpu_hour) == (
        "od",
        PoolKind.ON_DEMAND,
        1536,
        8,
        4.0,
    )
    assert (sp.name, sp.kind, sp.nodes, sp.price_per_gpu_hour) == ("spot", PoolKind.SPOT, 512, 1.6)
    assert sp.reclaim_per_node_hour == pytest.approx(0.3) and c.events == [] and c.gpus == 16_384
    assert [p.name for p in synthetic.synthetic_cluster(10, spot_share=0).pools] == ["od"]
    assert [p.name for p in synthetic.synthetic_cluster(10, spot_share=1).pools] == ["spot"]


@need(ACME_CSV)
def test_acme_constants_match_the_real_csv():
    with open(ACME_CSV, newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    targets = synthetic.acme_targets()
    assert set(targets) == {"Seren", "Kalos"}
    for cluster, nums in targets.items():
        for col, value in nums.items():
            assert float(rows[cluster][col]) == pytest.approx(value, rel=1e-9), (cluster, col)


# ------------------------------------------------------------------------------------------
# Alibaba
# ------------------------------------------------------------------------------------------


@need(ALIBABA)
def test_read_alibaba():
    jobs, cluster = traces.read_alibaba(ALIBABA)
    assert len(jobs) == 6203  # 7064 GPU tasks less 861 never scheduled or without a positive run
    assert [(p.name, p.nodes, p.gpus_per_node, p.kind) for p in cluster.pools] == [
        ("alibaba-1gpu", 24, 1, PoolKind.ON_DEMAND),
        ("alibaba-2gpu", 518, 2, PoolKind.ON_DEMAND),
        ("alibaba-4gpu", 54, 4, PoolKind.ON_DEMAND),
        ("alibaba-8gpu", 617, 8, PoolKind.ON_DEMAND),
    ]
    assert sum(p.nodes for p in cluster.pools) == 1213 and cluster.events == []
    sub = [j.submit_s for j in jobs]
    assert sub[0] == 0.0 and sub == sorted(sub) and [j.seq for j in jobs] == list(range(len(jobs)))
    prio = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}
    for j in jobs:
        assert j.nodes == 1 and j.gpus_per_node in (1, 2, 4, 8) and j.duration_s > 0
        assert j.priority == prio[j.tenant] and j.limit_s >= j.duration_s
    first = jobs[0]
    assert (first.id, first.gpus_per_node, first.duration_s) == ("openb-pod-0000", 1, 12537496.0)
    again, _ = traces.read_alibaba(ALIBABA, limit=100)
    assert [_fields(j) for j in again] == [_fields(j) for j in jobs[:100]]


def test_read_alibaba_synthetic_folder(tmp_path):
    (tmp_path / traces.ALIBABA_NODES).write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,8,A\nn1,1,1,0,\nn2,1,1,2,B\n"
    )
    (tmp_path / traces.ALIBABA_PODS).write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,1,1,1,300,,BE,Running,100,500,120\n"
        "p1,1,1,0,0,,LS,Running,50,500,60\n"
        "p2,1,1,8,1000,,Burstable,Failed,40,90,45\n"
        "p3,1,1,2,1000,,LS,Pending,60,70,\n"
        "p4,1,1,4,1000,,Guaranteed,Running,70,70,70\n"
    )
    jobs, cluster = traces.read_alibaba(tmp_path)
    assert [(j.id, j.submit_s, j.gpus_per_node, j.duration_s, j.priority, j.tenant) for j in jobs] == [
        ("p2", 0.0, 8, 45.0, 1, "Burstable"),
        ("p0", 60.0, 1, 380.0, 0, "BE"),
    ]
    assert [(p.name, p.nodes) for p in cluster.pools] == [("alibaba-2gpu", 1), ("alibaba-8gpu", 1)]
    pods = (tmp_path / traces.ALIBABA_PODS).read_text().replace("Burstable", "Gold")
    (tmp_path / traces.ALIBABA_PODS).write_text(pods)
    with pytest.raises(formats.WorkloadError, match=r":4: column 'qos'"):
        traces.read_alibaba(tmp_path)
    with pytest.raises(formats.WorkloadError, match="no such file"):
        traces.read_alibaba(tmp_path / "nowhere")


@need(ALIBABA)
def test_alibaba_barely_loads_its_cluster_as_its_docs_say():
    """A pod list for packing studies: its GPU-seconds over its cluster's, over its span."""
    jobs, cluster = traces.read_alibaba(ALIBABA)
    span = max(j.submit_s + j.duration_s for j in jobs)
    load = sum(j.gpus * j.duration_s for j in jobs) / (cluster.gpus * span)
    assert load < 0.01
    assert "pod list for packing studies" in traces.read_alibaba.__doc__


# ------------------------------------------------------------------------------------------
# Philly
# ------------------------------------------------------------------------------------------


def test_philly_shape():
    got = {g: traces.philly_shape(g) for g in (1, 2, 4, 8, 12, 16, 24, 32, 64, 128)}
    assert got == {
        1: (1, 1), 2: (1, 2), 4: (1, 4), 8: (1, 8), 12: (2, 6), 16: (2, 8), 24: (3, 8), 32: (4, 8),
        64: (8, 8), 128: (16, 8),
    }  # fmt: skip
    for g in range(1, 200):
        n, gpn = traces.philly_shape(g)
        assert n * gpn == g and gpn <= 8


PHILLY_ROWS = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:00:10,100.0,1,100.0,aa11
2017-09-30 23:59:59,50.0,1,50.0,aa11
2017-10-01 01:00:00,3600.0,16,57600.0,bb22
2017-10-02 00:00:00,10.0,2,20.0,aa11
2017-10-01 00:00:05,20.0,12,240.0,cc33
"""


def test_read_philly_synthetic_folder(tmp_path):
    (tmp_path / traces.PHILLY_CSV).write_text(PHILLY_ROWS)
    jobs, cluster, replay = traces.read_philly(tmp_path, gpus=64, start="2017-10-01", days=1, seed=3)
    got = [(j.id, j.tenant, j.submit_s, j.nodes, j.gpus_per_node, j.duration_s) for j in jobs]
    assert got == [
        ("philly-000006", "cc33", 5.0, 2, 6, 20.0),
        ("philly-000002", "aa11", 10.0, 1, 1, 100.0),
        ("philly-000004", "bb22", 3600.0, 2, 8, 3600.0),
    ]  # the window is [start, start + days); ids are the csv lines; submit order
    assert [(p.name, p.kind, p.nodes, p.gpus_per_node) for p in cluster.pools] == [("philly", PoolKind.ON_DEMAND, 8, 8)]
    assert (replay.jobs, replay.tenants, replay.gpus) == (3, 3, 64)
    assert replay.offered_load == pytest.approx((240 + 100 + 57600) / (64 * 86400))
    for j in jobs:  # drawn as synthetic draws them
        assert j.limit_s >= j.duration_s and j.ckpt.grace_s in (30.0, 60.0, 120.0, 300.0) and 0 <= j.priority <= 3
    again, _, _ = traces.read_philly(tmp_path, gpus=64, start="2017-10-01", days=1, seed=3)
    assert [_fields(j) for j in again] == [_fields(j) for j in jobs]
    assert "64 GPUs" in replay.describe() and "drawn" in replay.describe()


@pytest.mark.parametrize(
    ("line", "col"),
    [
        ("2017-10-01 00:00:10,-1,1,1,aa11", "duration"),
        ("2017-10-01,1,1,1,aa11", "timestamp"),
        ("2017-10-01 00:00:10,1,zero,1,aa11", "num_gpus"),
        ("2017-10-01 00:00:10,1,1,1, aa11 x", "cluster"),
    ],
)
def test_read_philly_errors_name_file_line_and_column(tmp_path, line, col):
    (tmp_path / traces.PHILLY_CSV).write_text(PHILLY_ROWS + line + "\n")
    with pytest.raises(formats.WorkloadError, match=rf"philly.csv:7: column '{col}'"):
        traces.read_philly(tmp_path)


def test_read_philly_options(tmp_path):
    (tmp_path / traces.PHILLY_CSV).write_text(PHILLY_ROWS)
    with pytest.raises(formats.WorkloadError, match="multiple of 8"):
        traces.read_philly(tmp_path, gpus=60)
    with pytest.raises(formats.WorkloadError, match="YYYY-MM-DD"):
        traces.read_philly(tmp_path, start="Oct 1")
    with pytest.raises(formats.WorkloadError, match="do not fit 8 GPUs"):
        traces.read_philly(tmp_path, gpus=8)
    with pytest.raises(formats.WorkloadError, match="no such file"):
        traces.read_philly(tmp_path / "nowhere")
    with pytest.raises(formats.WorkloadError, match="no job submitted in 2 days from 2018-01-01"):
        traces.read_philly(tmp_path, start="2018-01-01", days=2)


@need(PHILLY)
def test_read_philly_real_trace():
    """SOURCE.md's figures: 68,510 submissions Oct 1 - Nov 30; 640 GPUs offered about 3/4 of their time."""
    jobs, cluster, replay = traces.read_philly(PHILLY)
    assert len(jobs) == replay.jobs == 68_510
    assert cluster.gpus == 640 and 0.70 < replay.offered_load < 0.80
    assert replay.tenants == len({j.tenant for j in jobs}) >= 10
    assert max(j.gpus for j in jobs) <= 128 and all(j.gpus_per_node <= 8 for j in jobs)
    assert jobs[0].submit_s >= 0 and jobs[-1].submit_s < 61 * 86400


# ------------------------------------------------------------------------------------------
# SkyPilot spot traces
# ------------------------------------------------------------------------------------------


def _max_held(events: list[formats.ClusterEvent]) -> int:
    """Most nodes taken at once, counting nodes under notice as taken."""
    marks = []
    for e in events:
        end = math.inf if e.return_s is None else e.t + e.notice_s + e.return_s
        marks += [(e.t, 1, e.nodes), (end, 0, -e.nodes)]  # at a tie, a return frees before a take
    held = most = 0
    for _, _, d in sorted(marks):
        held += d
        most = max(most, held)
    return most


def test_pair_drops():
    assert interruptions._pair_drops([4, 4, 2, 2, 4, 4, 3, 3]) == [(2, 2, 2), (6, 1, None)]
    assert interruptions._pair_drops([4, 0, 2, 4]) == [(1, 2, 1), (1, 2, 2)]
    assert interruptions._pair_drops([0, 1, 1, 0]) == [(3, 1, None)]  # the launch is no return
    assert interruptions._pair_drops([2, 1, 0, 2]) == [(1, 1, 2), (2, 1, 1)]  # FIFO
    assert interruptions._pair_drops([1, 1, 0, 1], seam=2) == []  # the rotation's seam is no reclaim


@pytest.mark.parametrize("off", [0, 1, 3, 5, 6])
def test_rotation_matches_replaying_the_rotated_series(monkeypatch, off):
    counts = [0, 2, 3, 1, 1, 3, 0, 2]
    rotated = counts[off:] + counts[:off]
    seam = (len(counts) - off) % len(counts)
    expect = interruptions._pair_drops(rotated, seam=seam if off else -1)

    class Fixed:
        def integers(self, lo, hi, size):
            return np.full(size, off)

    monkeypatch.setattr(synthetic.np.random, "default_rng", lambda seed: Fixed())
    ev = interruptions.reclaims_from_trace(counts, 1.0, pool="p", pool_nodes=3, notice_s=0.0)
    assert [(e.t, e.nodes, e.return_s) for e in ev] == [
        (float(t), k, None if b is None else float(b)) for t, k, b in expect
    ]


def test_reclaims_from_trace_groups_and_phases():
    counts, gap = [2, 2, 1, 1, 2, 2], 300.0
    ev = interruptions.reclaims_from_trace(counts, gap, pool="spot", pool_nodes=10, notice_s=60, seed=4)
    assert len(ev) == 5  # 5 groups of 2, one drop of one node in every rotation
    assert all(e.kind == "reclaim" and e.pool == "spot" and e.nodes == 1 and e.notice_s == 60 for e in ev)
    assert {e.return_s for e in ev} <= {600.0, None}
    assert [e.t for e in ev] == sorted(e.t for e in ev) and len({e.t for e in ev}) > 1
    assert ev == interruptions.reclaims_from_trace(counts, gap, pool="spot", pool_nodes=10, notice_s=60, seed=4)
    assert interruptions.reclaims_from_trace([0, 0], gap, pool="spot", pool_nodes=4) == []


def test_reclaims_never_take_more_than_the_pool():
    counts = [1, 0, 1, 0, 1, 0, 1, 0, 1]
    ev = interruptions.reclaims_from_trace(counts, 10.0, pool="p", pool_nodes=1, notice_s=100.0, seed=0)
    assert ev and _max_held(ev) <= 1 and len(ev) < 4


@need(SKYPILOT)
def test_real_skypilot_traces():
    files = sorted(SKYPILOT.glob("*/*/*.json"))
    assert files
    for f in files:
        counts, gap = interruptions.read_skypilot(f)
        assert counts and gap > 0 and all(c >= 0 for c in counts)
        ev = interruptions.reclaims_from_trace(counts, gap, pool="spot", pool_nodes=64, seed=1)
        assert _max_held(ev) <= 64
        size = max(counts)
        assert all(e.nodes <= size for e in ev)
    v100 = [
        interruptions.trace_reclaim_rate(*interruptions.read_skypilot(f))
        for f in sorted(SKYPILOT.glob("1-node/*/*v100*.json"))
    ]
    # what the docs of SPOT_RECLAIM_PER_NODE_HOUR say: these traces run 0.3-0.7 per node-hour
    assert len(v100) == 4 and all(0.3 < r < 0.75 for r in v100)
    assert min(v100) > synthetic.SPOT_RECLAIM_PER_NODE_HOUR


def test_read_skypilot_validates(tmp_path):
    p = write(tmp_path, json.dumps({"metadata": {"gap_seconds": 300}, "data": [1, 1, 0]}), "t.json")
    assert interruptions.read_skypilot(p) == ([1, 1, 0], 300.0)
    bad = [
        ({"metadata": {"gap_seconds": 0}, "data": [1]}, "metadata.gap_seconds"),
        ({"metadata": {}, "data": [1]}, "metadata.gap_seconds: required"),
        ({"data": [1]}, "metadata: required"),
        ({"metadata": {"gap_seconds": 30}, "data": []}, "data: expected a non-empty list"),
        ({"metadata": {"gap_seconds": 30}, "data": [1, -1]}, "data[1]: expected an int >= 0"),
        ({"metadata": {"gap_seconds": 30}, "data": [1, 0.5]}, "data[1]"),
    ]
    for obj, msg in bad:
        p = write(tmp_path, json.dumps(obj), "t.json")
        with pytest.raises(formats.WorkloadError) as e:
            interruptions.read_skypilot(p)
        assert str(e.value).startswith(f"{p}: {msg}"), str(e.value)
    assert interruptions.trace_reclaim_rate([1, 1, 0, 1], 1800.0) == pytest.approx(1.0)  # 1 loss in 1 node-hour


# ------------------------------------------------------------------------------------------
# Llama 3 failures
# ------------------------------------------------------------------------------------------


def test_llama3_expected_rate_is_419_per_54_days():
    c = synthetic.synthetic_cluster()  # 2048 nodes x 8 = 16,384 GPUs
    per_s = sum(p.nodes * p.gpus_per_node for p in c.pools) / interruptions.llama3_gpu_mtbf_s()
    assert c.gpus == LLAMA3_GPUS
    assert per_s * LLAMA3_DAYS * 86400 == pytest.approx(LLAMA3_UNEXPECTED)


def test_llama3_failures_count_and_shape():
    c = synthetic.synthetic_cluster()
    horizon = 10 * LLAMA3_DAYS * 86400.0
    ev = interruptions.llama3_failures(c, horizon, seed=5)
    expect = 10 * LLAMA3_UNEXPECTED
    assert abs(len(ev) - expect) < 5 * math.sqrt(expect)  # Poisson, 5 sigma
    hw = [e for e in ev if e.kind == "node_loss"]
    share = len(hw) / len(ev)
    assert abs(share - 0.78) < 5 * math.sqrt(0.78 * 0.22 / len(ev))
    assert {e.kind for e in ev} == {"node_loss", "job_failure"}
    assert [e.t for e in ev] == sorted(e.t for e in ev) and all(0 <= e.t < horizon for e in ev)
    sizes = {p.name: p.nodes for p in c.pools}
    assert all(e.nodes == 1 and e.notice_s == 0 and 0 <= e.seed_key < sizes[e.pool] for e in ev)
    assert all(e.return_s == 4 * 3600.0 for e in hw)
    assert all(e.return_s is None for e in ev if e.kind == "job_failure")
    assert {e.pool for e in ev} == {"od", "spot"} and len({(e.pool, e.seed_key) for e in ev}) > 1000
    assert ev == interruptions.llama3_failures(c, horizon, seed=5) and ev != interruptions.llama3_failures(
        c, horizon, seed=6
    )


def test_llama3_failures_options():
    c = formats.Cluster([Pool("p", PoolKind.ON_DEMAND, 100, 8)], [])
    ev = interruptions.llama3_failures(c, 3e8, seed=0, hardware_share=1.0, repair_s=None)
    assert ev and all(e.kind == "node_loss" and e.return_s is None for e in ev)
    assert interruptions.llama3_failures(c, 0.0) == []
    with pytest.raises(ValueError):
        interruptions.llama3_failures(c, 1.0, hardware_share=1.5)
