"""Who a tenant's job runs as: the rules of goodput.sched.live.runas on this machine's user database."""

from __future__ import annotations

import os

import pytest

from goodput.sched.live.runas import RunAsError, UserMap, configured_from, myself, resolve


def test_resolve_names_ids_and_groups():
    root = resolve("root")
    assert (root.uid, root.gid, root.user) == (0, 0, "root") and 0 in root.groups
    assert resolve("0") == root
    with pytest.raises(RunAsError, match="no Unix user"):
        resolve("no-such-user-goodput")
    me = myself()
    assert me.uid == os.geteuid()


def test_a_root_service_maps_refuses_or_is_allowed():
    users = configured_from({"alice": "root", "bob": None}, {"bob": "nobody", "carol": "root"})
    strict = UserMap(users, euid=0)
    with pytest.raises(RunAsError, match="--allow-root-jobs"):
        strict.for_tenant("alice")  # mapped to root
    assert strict.for_tenant("bob").user == "nobody"  # the store's mapping when the cluster JSON has none
    with pytest.raises(RunAsError, match="token add dave --user"):
        strict.for_tenant("dave")  # no user at all
    lax = UserMap(users, euid=0, allow_root=True)
    assert lax.for_tenant("dave") is None and lax.for_tenant("alice").uid == 0


def test_a_service_that_is_not_root_runs_every_job_as_itself():
    m = UserMap(configured_from({"alice": "nobody"}, {}), euid=1000)
    assert not m.switches_users and m.for_tenant("alice") is None and m.for_tenant("anyone") is None
