"""What the operator decides and tenants live inside: per-tenant weight, quota and priority cap,
and the cluster's limits on what a job may declare and on how often it may be disturbed.

The cluster JSON's ``"tenants"`` and ``"limits"`` (docs/SCHED.md, "Governance") parse into one
:class:`Governance`. A tenant's own job spec never sets its eviction inputs past the operator's
caps (a ``grace_s`` of 1e9 would hold a preemptor for ever; a ``restart_s`` of a day would make a
job never a victim): :meth:`Governance.check` refuses such a submission naming the field, and the
scheduler enforces the rest (quotas, time limits, the preemption budget, fair share on decayed
usage). A tenant the file does not name gets weight 1, no quota and ``limits.max_priority`` as its
priority cap. A key the file's ``tenants`` or ``limits`` does not know is an error, not ignored: a
misspelt cap that silently caps nothing is what an operator would least expect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .ids import check_id
from .model import Job


class SubmissionRejected(ValueError):
    """A job spec outside what the operator allows; ``field`` names the offending input
    (the workload CSV's column name, the HTTP body's key)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class GovernanceError(ValueError):
    """A bad ``tenants`` or ``limits`` value; ``field`` is its JSON key path (``tenants[2].weight``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Limits:
    """The cluster JSON's ``limits`` object (seconds unless named otherwise)."""

    max_grace_s: float = 600.0  # the longest preemption notice a job may ask for
    max_restart_s: float = 1800.0  # the longest declared resume cost (it lowers a victim's price)
    min_run_s: float = 600.0  # a run younger than this is no candidate for priority or quota preemption
    max_preemptions: int = 5  # a job preempted this often for priority or quota is no candidate any more
    over_time_limit_s: float = 60.0  # what a run may exceed its limit_s by before it is asked to stop
    unkillable_s: float = 300.0  # a kill whose exit has not arrived after this takes the nodes out
    usage_half_life_s: float = 604800.0  # fair share's usage decays by half over this (one week)
    infra_backoff_s: float = 60.0  # first delay before an infrastructure loss is retried; doubles
    max_infra_losses: int = 10  # infrastructure losses a job may suffer before it fails for good
    # exits 75 ("checkpointed, yielding") nobody asked for: a node-level notice that reached the job
    # first is one, a job that yields at every start would requeue for ever; past this it fails
    max_unasked_yields: int = 10
    # jobs one tenant may have not yet ended (pending, running or preempting): the live service refuses
    # an HTTP submission past it (429); the simulator's workloads are the operator's own and ignore it
    max_queued_per_tenant: int = 100_000
    # bytes a run's log may hold (the live service's local executor): past it the log keeps its newest half
    max_log_bytes: int = 64 << 20
    # ended jobs (finished, failed, cancelled) the live service keeps for their views: one that ended
    # longer ago than this, or past this many ended jobs of its tenant (the oldest first), is removed
    # from memory and from the store (GET answers 410 naming why); the simulator keeps every job
    ended_retention_s: float = 7 * 86400.0
    max_ended_per_tenant: int = 10_000
    # the priority cap of a tenant without one of its own (every tenant the file does not name); None: any
    max_priority: int | None = None
    # events the live service's log keeps (in the store and in memory): past it, or older than
    # event_retention_s (None: no age bound), the oldest are deleted and readers below them told so
    event_retention: int = 1_000_000
    event_retention_s: float | None = None

    def decay(self, dt: float) -> float:
        """The factor usage keeps over ``dt`` seconds."""
        if dt <= 0:
            return 1.0
        return 0.5 ** (dt / self.usage_half_life_s)

    def infra_delay(self, losses: int) -> float:
        """Backoff before the ``losses``-th infrastructure loss is retried (60 s doubling to 1 h)."""
        return min(3600.0, self.infra_backoff_s * (2.0 ** max(0, losses - 1)))


@dataclass(frozen=True)
class TenantSpec:
    """One entry of the cluster JSON's ``tenants`` list."""

    name: str
    weight: float = 1.0  # fair share compares decayed usage / weight
    quota_gpus: int | None = None  # guaranteed share (Kueue's nominal quota); None: none
    max_priority: int | None = None  # highest priority the tenant may submit at; None: any
    user: str | None = None  # Unix user the tenant's jobs run as (the live service, the Slurm executor)
    ckpt_prefix: str | None = None  # where the tenant's ckpt_root must live (the live service)


_DEFAULT_TENANT_CACHE: dict[str, TenantSpec] = {}

_LIMIT_KEYS: dict[
    str, str
] = {  # key -> "num" (finite >= 0), "pos" (finite > 0), "int" (int >= 0), "count" (>= 1), "prio" (any int)
    "max_grace_s": "num",
    "max_restart_s": "num",
    "min_run_s": "num",
    "max_preemptions": "int",
    "over_time_limit_s": "num",
    "unkillable_s": "pos",
    "usage_half_life_s": "pos",
    "infra_backoff_s": "num",
    "max_infra_losses": "int",
    "max_unasked_yields": "int",
    "max_queued_per_tenant": "count",
    "max_log_bytes": "count",
    "ended_retention_s": "num",
    "max_ended_per_tenant": "int",
    "max_priority": "prio",
    "event_retention": "count",
    "event_retention_s": "pos",
}
_TENANT_KEYS = ("name", "weight", "quota_gpus", "max_priority", "user", "ckpt_prefix")


def _unknown(obj: dict, known: Any, at: str) -> None:
    extra = sorted(str(k) for k in obj if k not in known)
    if extra:
        raise GovernanceError(
            f"{at}.{extra[0]}",
            f"unknown key (known: {', '.join(known)}): a misspelt limit would limit nothing",
        )


def _num(v: Any, at: str, *, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise GovernanceError(at, f"expected a finite number {'>' if positive else '>='} 0, got {v!r}")
    return float(v)


def _int(v: Any, at: str, lo: int | None = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        raise GovernanceError(at, "expected an integer" + (f" >= {lo}" if lo is not None else "") + f", got {v!r}")
    return v


def limit_value(key: str, v: Any) -> Any:
    """One ``limits`` value checked as the cluster file's are (an error names ``limits.<key>``):
    what another place that sets a limit (a Service argument) checks it with."""
    kind, at = _LIMIT_KEYS[key], f"limits.{key}"
    if kind == "prio":
        return _int(v, at, None)
    if kind in ("int", "count"):
        return _int(v, at, 1 if kind == "count" else 0)
    return _num(v, at, positive=kind == "pos")


def _opt_str(v: Any, at: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v or v != v.strip():
        raise GovernanceError(at, f"expected a non-empty string without surrounding spaces, got {v!r}")
    return v


@dataclass(frozen=True)
class Governance:
    tenants: Mapping[str, TenantSpec] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)

    def tenant(self, name: str) -> TenantSpec:
        """The tenant's spec; one the operator did not name gets weight 1, no quota and the limits'
        priority cap."""
        spec = self.tenants.get(name)
        if spec is not None:
            return spec
        got = _DEFAULT_TENANT_CACHE.get(name)
        if got is None:
            if len(_DEFAULT_TENANT_CACHE) > 100_000:
                _DEFAULT_TENANT_CACHE.clear()
            got = _DEFAULT_TENANT_CACHE[name] = TenantSpec(name)
        return got

    @classmethod
    def from_obj(cls, tenants_obj: Any, limits_obj: Any) -> Governance:
        """Parse and validate the cluster JSON's ``tenants`` and ``limits`` values (None: absent).

        A bad value or a key these objects do not know raises :class:`GovernanceError` naming its
        key path; a tenant's name follows the id rule (:data:`~goodput.sched.core.ids.ID_RULE`),
        since a name no job can carry leaves the real tenant uncapped."""
        tenants: dict[str, TenantSpec] = {}
        if tenants_obj is not None:
            if not isinstance(tenants_obj, list):
                raise GovernanceError("tenants", f"expected a list, got {type(tenants_obj).__name__}")
            seen: dict[str, int] = {}
            for i, t in enumerate(tenants_obj):
                at = f"tenants[{i}]"
                if not isinstance(t, dict):
                    raise GovernanceError(at, f"expected an object, got {type(t).__name__}")
                _unknown(t, _TENANT_KEYS, at)
                name = _opt_str(t.get("name"), f"{at}.name")
                if name is None:
                    raise GovernanceError(f"{at}.name", "required key is missing")
                try:
                    check_id(name)
                except ValueError as e:
                    raise GovernanceError(f"{at}.name", f"not a tenant name a job can carry: {e}") from None
                if name in seen:
                    raise GovernanceError(f"{at}.name", f"duplicate tenant {name!r} (also tenants[{seen[name]}])")
                seen[name] = i
                weight = 1.0 if t.get("weight") is None else _num(t["weight"], f"{at}.weight", positive=True)
                quota = None if t.get("quota_gpus") is None else _int(t["quota_gpus"], f"{at}.quota_gpus")
                maxp = None if t.get("max_priority") is None else _int(t["max_priority"], f"{at}.max_priority", None)
                tenants[name] = TenantSpec(
                    name=name,
                    weight=weight,
                    quota_gpus=quota,
                    max_priority=maxp,
                    user=_opt_str(t.get("user"), f"{at}.user"),
                    ckpt_prefix=_opt_str(t.get("ckpt_prefix"), f"{at}.ckpt_prefix"),
                )
        values: dict[str, Any] = {}
        if limits_obj is not None:
            if not isinstance(limits_obj, dict):
                raise GovernanceError("limits", f"expected an object, got {type(limits_obj).__name__}")
            _unknown(limits_obj, tuple(_LIMIT_KEYS), "limits")
            for key in _LIMIT_KEYS:
                v = limits_obj.get(key)
                if v is not None:
                    values[key] = limit_value(key, v)
        return cls(tenants=tenants, limits=Limits(**values))

    def to_obj(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The ``tenants`` and ``limits`` values as the cluster JSON writes them."""
        tenants: list[dict[str, Any]] = []
        for spec in self.tenants.values():
            d: dict[str, Any] = {"name": spec.name, "weight": spec.weight}
            for key in ("quota_gpus", "max_priority", "user", "ckpt_prefix"):
                v = getattr(spec, key)
                if v is not None:
                    d[key] = v
            tenants.append(d)
        limits = {key: getattr(self.limits, key) for key in _LIMIT_KEYS if getattr(self.limits, key) is not None}
        return tenants, limits

    def check(self, job: Job) -> None:
        """Refuse a submission outside the operator's limits, naming the field (CSV column names)."""
        numbers = (
            ("submit_s", job.submit_s),
            ("duration_s", job.duration_s),
            ("limit_s", job.limit_s),
            ("ckpt_interval_s", job.ckpt.interval_s),
            ("ckpt_write_s", job.ckpt.write_s),
            ("ckpt_stall_s", job.ckpt.stall_s),
            ("restart_s", job.ckpt.restart_s),
            ("grace_s", job.ckpt.grace_s),
        )
        for name, v in numbers:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise SubmissionRejected(name, f"job {job.id!r}: expected a finite number >= 0, got {v!r}")
        if isinstance(job.priority, bool) or not isinstance(job.priority, int):
            raise SubmissionRejected("priority", f"job {job.id!r}: expected an integer, got {job.priority!r}")
        spec = self.tenant(job.tenant)
        own = spec.max_priority is not None
        cap = spec.max_priority if own else self.limits.max_priority
        if cap is not None and job.priority > cap:
            whose = (
                f"tenant {job.tenant!r}'s max_priority {cap}"
                if own
                else f"the cluster's limits.max_priority {cap} (tenant {job.tenant!r} has no max_priority of its own)"
            )
            raise SubmissionRejected("priority", f"job {job.id!r}: priority {job.priority} is above {whose}")
        lim = self.limits
        if job.ckpt.grace_s > lim.max_grace_s:
            raise SubmissionRejected(
                "grace_s",
                f"job {job.id!r}: grace_s {job.ckpt.grace_s:g} is above the cluster's max_grace_s {lim.max_grace_s:g}",
            )
        if job.ckpt.restart_s > lim.max_restart_s:
            raise SubmissionRejected(
                "restart_s",
                f"job {job.id!r}: restart_s {job.ckpt.restart_s:g} is above the cluster's max_restart_s "
                f"{lim.max_restart_s:g}",
            )
