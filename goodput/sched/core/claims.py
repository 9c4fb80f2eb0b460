"""Starting a job on nodes, releasing them, and claims: nodes that victims are leaving, held for
the preemptor until every one of them has room (the start happens only then)."""

from __future__ import annotations

from typing import Any

from . import events as ev
from .model import Health, Job, JobState
from .state import SchedulerState


class Claims(SchedulerState):
    # ------------------------------------------------------------------ the pass

    def _start(self, job: Job, pool: str, nodes: tuple[str, ...], *, backfill: bool = False) -> None:
        """Bind the gang and start it; ``backfill``: it starts while a head's reservation is in
        force (around it, or done before its time), which its ``started`` record says."""
        now = self.clock.now()
        self._starts += 1
        self._mutations += 1
        self.queue.remove(job.id)
        limit = job.backfill_limit(self.gov.limits.max_restart_s)
        held = self._reservation_cache[1] if self._reservation_cache is not None else None
        if held is not None and now + limit + self._margin(job) > held.t and not held.nodes.isdisjoint(nodes):
            self._reservation_cache = None  # it did not go around the reservation: that one no longer holds
        self._move(job, "start", "running")
        job.epoch += 1
        job.started_s = now
        job.resume_from_s = job.committed_s
        job.pool = pool
        job.placement = nodes
        job.claim, job.claim_pool = (), ""
        if job.first_start_s < 0:
            job.first_start_s = now
        job.run_limit_s = limit
        self.cap.bind(job.id, nodes, job.gpus_per_node, evictable_priority=job.priority)
        self._touched_nodes.update(nodes)
        tenant = self._tenant(job.tenant)
        tenant.fold(now, self.gov.limits.usage_half_life_s)
        tenant.usage_gpus += job.gpus
        self._touched_tenants.add(tenant.name)
        self._index_run(job, evictable_counted=True)
        if job.limit_s > 0:
            self._timer(now + limit + self.gov.limits.over_time_limit_s, "limit", job)
        self._touch(job)
        extra: dict[str, Any] = {"backfill": True} if backfill else {}
        self._emit(
            ev.STARTED,
            job=job.id,
            epoch=job.epoch,
            pool=pool,
            nodes=list(nodes),
            gpus_per_node=job.gpus_per_node,
            resume_from_s=job.committed_s,
            **extra,
        )
        self.executor.start(job, nodes, job.committed_s)

    def _release(self, job: Job) -> None:
        """Hand the job's GPUs back: called when it is observed gone (or, in one baseline, at the decision)."""
        self._drop_end(job)
        self._mutations += 1
        if not job.placement:
            return
        if job.state is JobState.PREEMPTING:
            self._leaving[job.tenant] = self._leaving.get(job.tenant, 0) - job.gpus
        for name in job.placement:
            node = self.cap.nodes[name]
            if job.state is JobState.PREEMPTING:
                node.draining = max(0, node.draining - job.gpus_per_node)
        self.cap.unbind(job.id, job.placement)
        self._freed[job.pool] += len(job.placement)
        if job.state is JobState.RUNNING and not self._unevictable(job) and self._victim_ok(job, self.clock.now()):
            low = self._freed_evictable[job.pool]
            low[job.priority] = low.get(job.priority, 0) + len(job.placement)
        self._touched_nodes.update(job.placement)
        tenant = self._tenant(job.tenant)
        tenant.fold(self.clock.now(), self.gov.limits.usage_half_life_s)
        tenant.usage_gpus -= job.gpus
        tenant.used_gpu_s += job.gpus * max(0.0, self.clock.now() - job.started_s)
        self._touched_tenants.add(tenant.name)
        self._emit(ev.RELEASED, job=job.id, epoch=job.epoch, nodes=list(job.placement), gpus=job.gpus)
        job.placement = ()
        self._touch(job)
        self._dirty = True
        claimant = self.jobs.get(job.preemptor) if job.preemptor else None
        if claimant is not None and claimant.id in self._claimants:
            self._try_claim(claimant)

    # ------------------------------------------------------------------ preemption

    def _try_claim(self, job: Job) -> int:
        """Start a claimant once every node it claimed has room (its victims are gone)."""
        if job.id not in self._claimants:
            return 0
        nodes = [self.cap.nodes[n] for n in job.claim]
        if any(n.health is not Health.UP for n in nodes):
            self._drop_claim(job, requeue=True)
            return 0
        if any(n.gpus - n.used < job.gpus_per_node for n in nodes):
            return 0
        del self._claimants[job.id]
        claim = job.claim
        self._unheld[job.claim_pool] += len(claim)
        self.cap.unclaim(claim)
        self._start(job, job.claim_pool, claim)
        return 1

    def _drop_claim(self, job: Job, *, requeue: bool) -> None:
        self._mutations += 1
        self._claimants.pop(job.id, None)
        if job.claim_pool:
            self._freed[job.claim_pool] += len(job.claim)
        self.cap.unclaim(job.claim)
        job.claim, job.claim_pool = (), ""
        job.substate = "queued"
        self._touch(job)
        if requeue and job.state is JobState.PENDING:
            self._enqueue(job)

    def _drop_claims_on(self, name: str) -> None:
        owner = self.cap.claimed.get(name)
        if owner is not None:
            self._drop_claim(self.jobs[owner], requeue=True)
