"""The live API fuzzed from its own OpenAPI document (issue 24, item 7).

schemathesis generates requests for every operation of ``/openapi.json`` (property-based, bounded in
examples per operation and in time) and sends them, with a valid tenant token, to a real
``goodput sched serve`` subprocess. Checked for each: no 5xx, and every status code answered is
listed in the document. Afterwards the store restores into a scheduler, and the independent
checker finds no violation in the whole event log.
"""

from __future__ import annotations

import json

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import status_code_conformance  # noqa: E402

from .test_service import Server  # noqa: E402

EXAMPLES = 8  # per operation: bounded; the deadline below bounds each example's time


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    s = Server(tmp, nodes=2)
    s.extra = (*s.extra, "--rate-limit", "0")
    s.tenant_token = s.token("alice")
    s.start()
    yield s
    s.stop()


def test_no_5xx_and_only_documented_statuses(live):
    """Every operation of the document, EXAMPLES generated requests each (schemathesis' strategies
    driven by hypothesis here: its pytest plugin does not load under this pytest)."""
    from hypothesis import given

    schema = schemathesis.openapi.from_url(live.url + "/openapi.json")
    headers = {"Authorization": f"Bearer {live.tenant_token}"}
    ops = 0
    for result in schema.get_all_operations():
        op = result.ok()
        ops += 1

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case) -> None:  # noqa: ANN001
            if isinstance(case.query, dict) and str(case.query.get("follow", "")).lower() in ("true", "1", "yes", "on"):
                case.query["follow"] = "false"  # a follow stream never ends by design (tested on its own)
            case.call_and_validate(headers=headers, checks=[not_a_server_error, status_code_conformance], timeout=10)

        run()
    assert ops >= 10


def test_afterwards_the_store_restores_and_the_checker_finds_nothing(live):
    from goodput.sched.core.executor import ManualClock, RecordingExecutor
    from goodput.sched.core.scheduler import Scheduler
    from goodput.sched.live.service import local_pools
    from goodput.sched.live.store import open_store
    from goodput.sched.sim.checker import check

    code, events = live.get("/events", live._admin)
    assert code == 200
    recs = [json.loads(x) for x in events.splitlines()]
    assert check(recs, {"local-00000": 1, "local-00001": 1}).total == 0
    assert live.get("/healthz", "")[1] == {"ok": True}
    with open_store(live.db) as store:
        s = Scheduler.restore(store, local_pools(2, 1), clock=ManualClock(), executor=RecordingExecutor())
        assert len(s.log.records) == len(recs)
