"""The operator's governance: the cluster JSON's tenants and limits, and the caps a submission meets."""

from __future__ import annotations

import json
import math

import pytest

from goodput.sched.core.executor import ManualClock, RecordingExecutor
from goodput.sched.core.governance import Governance, GovernanceError, Limits, SubmissionRejected, TenantSpec
from goodput.sched.core.model import Checkpointing, Job, Pool, PoolKind
from goodput.sched.core.scheduler import Scheduler
from goodput.sched.sim import formats

ISSUE_EXAMPLE = {
    "pools": [{"name": "od", "kind": "on-demand", "nodes": 4, "gpus_per_node": 8, "price_per_gpu_hour": 4.0}],
    "tenants": [{"name": "alice", "weight": 2, "quota_gpus": 64, "max_priority": 5}],
    "limits": {
        "max_grace_s": 600,
        "max_restart_s": 1800,
        "min_run_s": 600,
        "max_preemptions": 5,
        "over_time_limit_s": 60,
        "unkillable_s": 300,
        "usage_half_life_s": 604800,
    },
}


def test_the_issue_example_parses_and_round_trips(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(ISSUE_EXAMPLE))
    c = formats.read_cluster_json(p)
    alice = c.governance.tenant("alice")
    assert alice == TenantSpec("alice", weight=2.0, quota_gpus=64, max_priority=5)
    assert c.governance.limits == Limits()
    q = tmp_path / "d.json"
    formats.write_cluster_json(c, q)
    assert formats.read_cluster_json(q) == c


def test_unknown_tenants_get_the_defaults_and_absent_keys_mean_defaults(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"pools": ISSUE_EXAMPLE["pools"]}))
    g = formats.read_cluster_json(p).governance
    assert g == Governance()
    bob = g.tenant("bob")
    assert (bob.weight, bob.quota_gpus, bob.max_priority) == (1.0, None, None)
    assert "tenants" not in formats.cluster_to_obj(formats.read_cluster_json(p))  # an old file stays as it was


@pytest.mark.parametrize(
    "tenants, limits, field",
    [
        ([{"name": "a"}, {"name": "b"}, {"name": "c", "weight": 0}], None, "tenants[2].weight"),
        ([{"name": "a", "weight": "2"}], None, "tenants[0].weight"),
        ([{"name": "a", "quota_gpus": -1}], None, "tenants[0].quota_gpus"),
        ([{"name": "a", "quota_gpus": 1.5}], None, "tenants[0].quota_gpus"),
        ([{"name": "a", "max_priority": True}], None, "tenants[0].max_priority"),
        ([{"name": "a"}, {"name": "a"}], None, "tenants[1].name"),
        ([{"weight": 1}], None, "tenants[0].name"),
        ([{"name": " a"}], None, "tenants[0].name"),
        ({"name": "a"}, None, "tenants"),
        (None, {"max_grace_s": -1}, "limits.max_grace_s"),
        (None, {"max_preemptions": 2.5}, "limits.max_preemptions"),
        (None, {"usage_half_life_s": 0}, "limits.usage_half_life_s"),
        (None, {"unkillable_s": float("inf")}, "limits.unkillable_s"),
        (None, [1], "limits"),
        # a name no job can carry, or a misspelt key, would leave the real tenant uncapped
        ([{"name": "alice\u200b", "max_priority": 1}], None, "tenants[0].name"),
        ([{"name": "a b"}], None, "tenants[0].name"),
        ([{"name": "a", "maxpriority": 1}], None, "tenants[0].maxpriority"),
        (None, {"maxgrace_s": 60}, "limits.maxgrace_s"),
        (None, {"max_priority": 1.5}, "limits.max_priority"),
        (None, {"ended_retention_s": -1}, "limits.ended_retention_s"),
        (None, {"ended_retention_s": "7d"}, "limits.ended_retention_s"),
        (None, {"max_ended_per_tenant": 1.5}, "limits.max_ended_per_tenant"),
        (None, {"max_ended_per_tenant": -1}, "limits.max_ended_per_tenant"),
    ],
)
def test_a_bad_value_names_its_key_path(tenants, limits, field, tmp_path):
    with pytest.raises(GovernanceError) as e:
        Governance.from_obj(tenants, limits)
    assert e.value.field == field
    obj = {"pools": ISSUE_EXAMPLE["pools"], "tenants": tenants, "limits": limits}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(formats.WorkloadError) as e2:
        formats.read_cluster_json(p)
    assert str(e2.value).startswith(f"{p}: {field}: ")


def test_the_retention_limits_parse_with_their_defaults(tmp_path):
    """ended_retention_s and max_ended_per_tenant (the live service's retention of ended jobs): a
    week and 10,000 by default; 0 is allowed (ended jobs removed at once) and round-trips."""
    assert (Limits().ended_retention_s, Limits().max_ended_per_tenant) == (604800.0, 10_000)
    g = Governance.from_obj(None, {"ended_retention_s": 3600, "max_ended_per_tenant": 0})
    assert (g.limits.ended_retention_s, g.limits.max_ended_per_tenant) == (3600.0, 0)
    p = tmp_path / "c.json"
    p.write_text(json.dumps({**ISSUE_EXAMPLE, "limits": {"ended_retention_s": 60, "max_ended_per_tenant": 5}}))
    c = formats.read_cluster_json(p)
    assert (c.governance.limits.ended_retention_s, c.governance.limits.max_ended_per_tenant) == (60.0, 5)
    q = tmp_path / "d.json"
    formats.write_cluster_json(c, q)
    assert formats.read_cluster_json(q) == c


def _job(**kw) -> Job:
    ck = Checkpointing(
        grace_s=kw.pop("grace_s", 30.0), restart_s=kw.pop("restart_s", 0.0), interval_s=kw.pop("interval_s", 0.0)
    )
    base = dict(id="j", tenant="alice", priority=0, nodes=1, gpus_per_node=8, submit_s=0.0, duration_s=10.0)
    base.update(kw)
    return Job(ckpt=ck, **base)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"priority": 6}, "priority"),
        ({"grace_s": 1e9}, "grace_s"),
        ({"restart_s": 86400.0}, "restart_s"),
        ({"limit_s": math.inf}, "limit_s"),
        ({"duration_s": math.nan}, "duration_s"),
        ({"interval_s": -1.0}, "ckpt_interval_s"),
    ],
)
def test_the_scheduler_refuses_a_submission_outside_the_limits(kw, field):
    gov = Governance.from_obj(ISSUE_EXAMPLE["tenants"], ISSUE_EXAMPLE["limits"])
    s = Scheduler(
        [Pool("od", PoolKind.ON_DEMAND, 2, 8)], clock=ManualClock(), executor=RecordingExecutor(), governance=gov
    )
    with pytest.raises(SubmissionRejected) as e:
        s.submit(_job(**kw))
    assert e.value.field == field
    assert "j" not in s.jobs and len(s.log) == 0  # nothing recorded for a refused job
    s.submit(_job(priority=5, grace_s=600.0, restart_s=1800.0))  # at the caps: accepted
    s.submit(_job(id="k", tenant="bob", priority=1000))  # no cap for a tenant the operator did not name


def test_limits_max_priority_caps_every_tenant_without_a_cap_of_its_own():
    """A tenant the file does not name (a token added later) used to submit at any priority."""
    limits = dict(ISSUE_EXAMPLE["limits"], max_priority=2)
    gov = Governance.from_obj(ISSUE_EXAMPLE["tenants"] + [{"name": "carol"}], limits)
    s = Scheduler(
        [Pool("od", PoolKind.ON_DEMAND, 2, 8)], clock=ManualClock(), executor=RecordingExecutor(), governance=gov
    )
    for tenant in ("mallory", "carol"):
        with pytest.raises(SubmissionRejected, match="limits.max_priority 2") as e:
            s.submit(_job(id=f"x-{tenant}", tenant=tenant, priority=1000))
        assert e.value.field == "priority"
        s.submit(_job(id=f"ok-{tenant}", tenant=tenant, priority=2))
    s.submit(_job(id="a5", priority=5))  # alice's own cap (5) is hers, above the default
    assert Governance.from_obj(*gov.to_obj()) == gov
