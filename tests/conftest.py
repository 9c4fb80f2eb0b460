import os

import pytest

# variants of a parametrized test that run only with the slow ones, each because another variant
# that runs by default exercises the same path (the suite's 15 minutes)
SLOW_VARIANTS = {
    # the sqlite variant runs; PostgreSQL's restart path runs in the readopt and live-restart tests
    "tests/sched/live/test_service.py::test_a_preemption_in_flight_survives_a_service_sigkill[postgresql]",
    # all-process and rank1-thread run: each storm and each writer mode
    "tests/ckpt/storage/test_s3_storm_ranks.py::"
    "test_a_write_storm_fails_every_rank_of_an_async_save_with_the_storage_error[all-thread]",
    "tests/ckpt/storage/test_s3_storm_ranks.py::"
    "test_a_write_storm_fails_every_rank_of_an_async_save_with_the_storage_error[rank1-process]",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW_VARIANTS:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("GOODPUT_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or GOODPUT_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
