"""The compiled scheduler core is the sources: fresh, and deciding exactly as they do.

``setup.py`` compiles the modules :data:`goodput.sched.native.MODULES` names with mypyc. These
tests hold it to two promises: an extension never lags its source (Python would import the stale
extension over an edited ``.py``), and a simulation decides the same events, byte for byte,
compiled and as pure Python (the sources forced by an import hook in a second interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from goodput.sched import native

COMPILED = bool(native.status().compiled)

# one simulation per policy whose decisions all differ: its event log's digest, printed
_RUN = textwrap.dedent(
    """
    import hashlib, importlib.util, json, pathlib, sys
    if sys.argv[1] == "pure":
        import goodput
        here = pathlib.Path(goodput.__file__).parent / "sched"
        names = set(json.loads(sys.argv[2]))
        from goodput.sched import native  # itself never compiled: the hook needs its source_of

        class Sources:
            def find_spec(self, name, path=None, target=None):
                short = name.removeprefix("goodput.sched.")
                if short != name and short in names:
                    return importlib.util.spec_from_file_location(name, here / native.source_of(short))
                return None

        sys.meta_path.insert(0, Sources())
    from goodput.sched import native
    from goodput.sched.core.policy import POLICIES
    from goodput.sched.sim.simulator import simulate
    from goodput.bench.sched import cap_gangs
    from goodput.sched.sim.synthetic import synthetic, synthetic_cluster
    cluster = synthetic_cluster(nodes=96, gpus_per_node=8)
    jobs = synthetic(2500, nodes=96, gpus_per_node=8, seed=7)
    cap_gangs(jobs, list(cluster.pools))
    out = {"label": native.status().label}
    for name in ("goodput", "kueue-victims", "fifo-no-backfill", "spot-by-price"):
        r = simulate(jobs, cluster, POLICIES[name], check_log=False)
        body = "\\n".join(json.dumps(e, sort_keys=True) for e in r.events).encode()
        out[name] = [len(r.events), hashlib.sha256(body).hexdigest()]
    print(json.dumps(out))
    """
)


def _run(mode: str) -> dict:
    import json

    p = subprocess.run(
        [sys.executable, "-c", _RUN, mode, json.dumps(list(native.MODULES))],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_extensions_match_their_sources() -> None:
    st = native.status()
    if not st.compiled:
        assert os.environ.get("CI") != "true", "CI builds the compiled core: mypyc or the C compiler failed"
        pytest.skip("pure-Python install (mypyc or a C compiler was missing at install): nothing to check")
    assert not st.stale, f"rebuild with `make venv`: {st.label}"
    assert not st.pure, f"every listed module is compiled or none is: {st.label}"


@pytest.mark.skipif(not COMPILED, reason="pure-Python install: there is no compiled core to compare")
def test_compiled_and_pure_decide_the_same_events() -> None:
    compiled, pure = _run("native"), _run("pure")
    assert compiled.pop("label") == "compiled (mypyc)"
    assert pure.pop("label") == "pure Python"
    assert all(n > 5000 for n, _ in compiled.values()), compiled
    assert compiled == pure


def test_records_pickle_and_copy() -> None:
    """The comparison hands jobs and policies to worker processes by pickle; compiled, a frozen
    dataclass must rebuild through its constructor (its __reduce__) to survive that."""
    import copy
    import pickle

    from goodput.sched.core.model import Job
    from goodput.sched.core.policy import POLICIES
    from goodput.sched.core.scheduler import Reservation

    job = Job("j", "t", 3, 2, 8, submit_s=1.5, duration_s=10.0, limit_s=20.0, spot=True)
    job.ckpt.interval_s = 60.0
    things = [*POLICIES.values(), Reservation("j", "od", 5.0, frozenset({"od-0001"})), job]
    for x in things:
        assert pickle.loads(pickle.dumps(x)) == x
        assert copy.deepcopy(x) == x


def test_the_comparison_in_worker_processes_matches_one_process() -> None:
    from goodput.bench.sched import cap_gangs
    from goodput.sched.core.policy import POLICIES
    from goodput.sched.sim.compare import compare
    from goodput.sched.sim.synthetic import synthetic, synthetic_cluster

    cluster = synthetic_cluster(nodes=16, gpus_per_node=8)
    jobs = synthetic(300, nodes=16, gpus_per_node=8, seed=3)
    cap_gangs(jobs, list(cluster.pools))
    policies = [POLICIES["goodput"], POLICIES["kueue-victims"]]

    def figures(workers: int) -> list:
        out = []
        for r in compare(jobs, cluster, policies, workers=workers):
            m = {k: v for k, v in r.metrics.items() if k not in ("wall_s", "events_per_s")}
            out.append((r.name, m, r.tenants, r.waits))
        return out

    one = figures(1)
    assert one == figures(2)
    assert all(m["events"] > 500 for _, m, _, _ in one)


def test_the_comparison_never_forks_a_threaded_parent() -> None:
    """CI hung here once: a worker forked from a test process holding checkpoint threads."""
    from goodput.sched.sim.compare import _worker_context

    assert _worker_context().get_start_method() in ("forkserver", "spawn")
