"""Who a tenant's job runs as: the Unix user the operator maps the tenant to, resolved to ids.

Both executors need the same answer (the local one starts the job's command as that user; a Slurm
executor submits as that user), so it lives here, apart from either. The mapping comes from the
cluster JSON's ``tenants[].user`` first, then from the store (``goodput sched token add NAME
--user USER``). What a service may do with it depends on who the service is:

- running as root, it runs each tenant's jobs as the tenant's user and refuses a tenant with no
  user, or one mapped to root, unless the operator started it with ``--allow-root-jobs`` (a
  single-user machine: then such jobs run as root);
- running as anyone else, it cannot change user: every job runs as the service's own user, and
  the service says so when it starts (tenants are then not isolated from each other).
"""

from __future__ import annotations

import grp
import os
import pwd
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class RunAsError(ValueError):
    """A tenant's jobs may not run (no user, an unknown user, or root without the operator's consent)."""


@dataclass(frozen=True)
class RunAs:
    """A Unix identity to start a job's processes as."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups (the user's, from the group database)
    home: str

    def to_obj(self) -> dict:
        return {"user": self.user, "uid": self.uid, "gid": self.gid, "groups": list(self.groups), "home": self.home}


def resolve(user: str) -> RunAs:
    """The ids of ``user`` (a name, or a numeric uid with a passwd entry)."""
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError, OverflowError):
        raise RunAsError(f"no Unix user {user!r} on this machine") from None
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    return RunAs(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)


def myself() -> RunAs:
    """The identity this process runs as."""
    uid = os.geteuid()
    try:
        pw = pwd.getpwuid(uid)
        name, home = pw.pw_name, pw.pw_dir
    except KeyError:
        name, home = str(uid), "/"
    return RunAs(name, uid, os.getegid(), tuple(sorted(set(os.getgroups()))), home)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class UserMap:
    """tenant -> the identity its jobs run as (``None``: as the service itself).

    ``configured(tenant)`` gives the user name the operator set (cluster JSON first, then the store's
    mapping); :meth:`for_tenant` applies the rules of the module docstring and raises
    :class:`RunAsError` with the reason a tenant's jobs may not run.
    """

    def __init__(
        self,
        configured: Callable[[str], str | None],
        *,
        allow_root: bool = False,
        euid: int | None = None,
    ) -> None:
        self.configured = configured
        self.allow_root = allow_root
        self.euid = os.geteuid() if euid is None else euid
        self._seen: dict[str, tuple[float, RunAs]] = {}  # user -> (when resolved, ids): one passwd read a second

    @property
    def switches_users(self) -> bool:
        """Whether jobs can run as other users at all (only a root service can)."""
        return self.euid == 0

    def for_tenant(self, tenant: str) -> RunAs | None:
        if not self.switches_users:
            return None  # a normal user's service runs every job as itself (said at start)
        user = self.configured(tenant)
        if user is None:
            if self.allow_root:
                return None
            raise RunAsError(
                f"tenant {tenant!r} has no Unix user to run its jobs as: set tenants[].user in the cluster JSON or "
                f"`goodput sched token add {tenant} --user USER`; this service runs as root and runs no job as "
                "root unless started with --allow-root-jobs"
            )
        hit = self._seen.get(user)
        now = time.monotonic()
        if hit is not None and now - hit[0] < 1.0:
            ra = hit[1]
        else:
            ra = resolve(user)
            if len(self._seen) > 10_000:
                self._seen.clear()
            self._seen[user] = (now, ra)
        if ra.uid == 0 and not self.allow_root:
            raise RunAsError(
                f"tenant {tenant!r} maps to {user!r}, which is root: this service runs no job as root unless "
                "started with --allow-root-jobs"
            )
        return ra


def configured_from(
    governance_users: Mapping[str, str | None], stored: Mapping[str, str]
) -> Callable[[str], str | None]:
    """The operator's mapping: the cluster JSON's ``tenants[].user``, else the store's."""

    def get(tenant: str) -> str | None:
        u = governance_users.get(tenant)
        return u if u else stored.get(tenant)

    return get


__all__ = ["RunAs", "RunAsError", "UserMap", "configured_from", "group_name", "myself", "resolve"]
