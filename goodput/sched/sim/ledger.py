"""One ledger for every allocated GPU-second: where the cluster's hours went.

Every run of every job is split, in GPU-seconds, into: useful work (progress that a later commit
or the finish kept), work lost to preemption, work lost to failures and infrastructure, restart
(reschedule, load, warm-up), checkpoint stall (training blocked by a snapshot), held while
draining (a leaving job's GPUs between the notice and its observed exit), and double-booked (a
started job waiting for GPUs that an unreleased victim still holds: what releasing at the
decision costs). Idle is capacity that no run held. The categories sum to the allocation exactly,
per policy, per tenant and per job: the badput breakdown operators ask for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = (
    "useful",
    "lost_preemption",
    "lost_failure",
    "restart",
    "checkpoint_stall",
    "draining",
    "double_booked",
)


@dataclass(slots=True)
class Account:
    useful: float = 0.0
    lost_preemption: float = 0.0
    lost_failure: float = 0.0
    restart: float = 0.0
    checkpoint_stall: float = 0.0
    draining: float = 0.0
    double_booked: float = 0.0
    cost_usd: float = 0.0
    spot_gpu_s: float = 0.0

    @property
    def allocated(self) -> float:
        return sum(getattr(self, c) for c in CATEGORIES)

    def add(self, other: Account) -> None:
        for c in (*CATEGORIES, "cost_usd", "spot_gpu_s"):
            setattr(self, c, getattr(self, c) + getattr(other, c))

    def hours(self) -> dict[str, float]:
        return {c: getattr(self, c) / 3600.0 for c in CATEGORIES}


@dataclass(slots=True)
class Ledger:
    total: Account = field(default_factory=Account)
    tenants: dict[str, Account] = field(default_factory=dict)
    jobs: dict[str, Account] = field(default_factory=dict)
    capacity_gpu_s: float = 0.0

    def charge(self, job: str, tenant: str, run: Account) -> None:
        self.total.add(run)
        self.tenants.setdefault(tenant, Account()).add(run)
        self.jobs.setdefault(job, Account()).add(run)

    @property
    def idle_gpu_s(self) -> float:
        return max(0.0, self.capacity_gpu_s - self.total.allocated)

    def goodput(self) -> float:
        a = self.total.allocated
        return self.total.useful / a if a > 0 else 0.0

    def utilization(self) -> float:
        return self.total.allocated / self.capacity_gpu_s if self.capacity_gpu_s > 0 else 0.0

    def breakdown_hours(self) -> dict[str, float]:
        out = self.total.hours()
        out["idle"] = self.idle_gpu_s / 3600.0
        return out
