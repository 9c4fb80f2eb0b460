#!/usr/bin/env python3
"""Run PyTorch DCP's own test files under DCP and under goodput.ckpt, with the import swapped as a user would.

    .venv/bin/python tools/dcp_tests.py /tmp/dcp-tests/upstream --json /tmp/dcp-tests/result.json

The upstream test files (``test/distributed/checkpoint/...`` of pytorch/pytorch) are not part of this
repository: pass them as files or directories (default ``/tmp/dcp-tests/upstream``). Everything the
harness writes goes under ``--scratch`` (default ``/tmp/dcp-tests/run``), never into the repository:

- ``dcp/``      byte-identical copies of the upstream files, run as they are (DCP);
- ``goodput/``  the swapped copies, plus ``<file>.swap.diff`` showing every changed line;
- ``hooks/``    ``sitecustomize.py`` (lets GPU-gated tests run on CPU) and the pytest result plugin;
- ``results/``  one JSON line per pytest event, per side and file.

The swap is the README's one-import change, literally: ``torch.distributed.checkpoint`` becomes
``goodput.ckpt`` in import statements, and so do its modules that goodput mirrors under the same name
(``state_dict_saver``, ``state_dict_loader``, ``filesystem``):

- ``import torch.distributed.checkpoint as X``                 -> ``import goodput.ckpt as X``
- ``import torch.distributed.checkpoint.state_dict_saver as X`` -> ``import goodput.ckpt.state_dict_saver as X``
- ``from torch.distributed.checkpoint[.<those>] import a, b``   -> ``from goodput.ckpt[.<those>] import a, b``

Every name the test then reaches through those (``X.save``, ``X.DefaultSavePlanner``,
``X.CheckpointException``, ``saver.AsyncCheckpointerType``...) is whatever goodput.ckpt gives: nothing
is routed to DCP behind goodput's back, and a name goodput lacks fails the test. The only exception is
a name listed in ``KEPT_FROM_DCP`` (DCP's private helpers and storage-layer classes, which goodput
does not have and a user would not import from goodput): its import stays DCP's, and every test whose
body uses such a name is left out of the goal automatically, with the name as its reason. Modules
goodput has no counterpart of (``state_dict``, ``stateful``, ``staging``, ``planner``, ``metadata``,
``utils``, ``_extension``...) are not touched: they are DCP's model-state utilities and types, which a
user keeps.

The environment (both runs, the same): ``sitecustomize.py`` on ``PYTHONPATH`` (so the ranks the tests
spawn get it too) changes two of torch's *test helpers*, nothing in DCP: every
``torch.testing._internal.common_distributed.skip_if_lt_x_gpu(n)`` behaves as ``allow_cpu=True`` (the
GPU-gated tests run on CPU, with gloo, at DTensorTestBase's CPU world size of 4), and
``DTensorTestBase.init_pg`` turns a backend string naming one pair twice (``"cpu:gloo,cpu:gloo"``, what
``TestE2ESaveAndLoad`` asks for on a CPU machine, refused by torch 2.13) into ``"gloo"``.
``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT`` (``--test-timeout``) bounds each multi-process test and
``OMP_NUM_THREADS=1``. ``expecttest`` (imported by ``torch.testing._internal.common_utils``) and
``zstandard`` (``test_dtensor_resharding.py`` builds ``ZStandard()`` while defining a class) are
pip-installed into ``<scratch>/deps`` if the interpreter lacks them.

By default goodput runs only the tests that passed under DCP (the goal is about those), and DCP
results are reused from an earlier run of the same file bytes, torch and hooks unless ``--rerun-dcp``;
``--report-only`` prints the table again from the last results.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import difflib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

DCP = "torch.distributed.checkpoint"
GOODPUT = "goodput.ckpt"
# DCP's module -> goodput's module of the same name: the literal swap
SWAP_MODULES = {
    DCP: GOODPUT,
    f"{DCP}.state_dict_saver": f"{GOODPUT}.state_dict_saver",
    f"{DCP}.state_dict_loader": f"{GOODPUT}.state_dict_loader",
    f"{DCP}.filesystem": f"{GOODPUT}.filesystem",
}
# names imported from a swapped module that stay DCP's (goodput has no such name and a user would not
# ask goodput for it); a test whose body uses one is left out of the goal, naming it
KEPT_FROM_DCP = {
    "_load_state_dict_from_keys": "DCP's private helper _load_state_dict_from_keys (reads with DCP's own reader)",
    "_StorageWriterTransforms": "DCP's private _StorageWriterTransforms (its file system's stream transforms)",
    "FileSystem": "DCP's storage layer class FileSystem (goodput's format has no such layer)",
}

# Tests of DCP's internals (planner classes, storage-writer/reader extensions and transforms): not part
# of the goal. Matched against the pytest node id (regex, search). Each with its reason; docs/DCP.md
# lists the same.
INTERNALS = [
    (
        # parametrized as extensions0 = None (a plain resharding test, in the goal), extensions1 =
        # [Rot13Example()], extensions2 = [ZStandard()]
        r"TestDTensorReshardPlacementChange::test_1d_to_1d_reshard_placement_change_extensions[12]$",
        "FileSystemWriter(_extensions=[Rot13Example()] / [ZStandard()]): DCP's private stream-transform extension API",
    ),
    (
        r"TestDistributedStateDictSaveLoadRot13::",
        "FileSystemWriter(_extensions=[Rot13Example()]) and FileSystemReader(_extension_registry=...): "
        "DCP's private stream-transform extension API",
    ),
    (
        r"TestDistributedStateDictSaveLoadZStandard::",
        "FileSystemWriter(_extensions=[ZStandard()]): DCP's private stream-transform extension API",
    ),
    (
        r"TestFileSystemWriterFlushBehavior::",
        "DCP's filesystem internals (_StorageWriterTransforms, FileSystem.create_stream, flush counts per file)",
    ),
    (
        # in the other recent version of test_file_system_checkpoint_cpu.py (see docs/DCP.md)
        r"TestThreadCountAutoTuning::",
        "DCP's FileSystemWriter thread-count tuning (max_threads=, its planner's create_local_plan)",
    ),
]

HOOK_SITECUSTOMIZE = '''\
"""Generated by tools/dcp_tests.py: let DCP's GPU-gated tests run on CPU, with gloo.

Two changes to torch's test helpers (not to DCP, not to the test files), both made as the helper
module is first imported, in every process (this file is on PYTHONPATH, so the ranks the tests
spawn get it too). DCP_TESTS_ALLOW_CPU=0 turns both off.

1. torch.testing._internal.common_distributed.skip_if_lt_x_gpu(n, allow_cpu=False) skips a test on
   a machine with fewer than n accelerators unless allow_cpu=True: every use behaves as
   allow_cpu=True (the switch upstream flips test by test).
2. DTensorTestBase.init_pg: a backend string naming one device:backend pair twice collapses to
   that backend. TestE2ESaveAndLoad asks for f"cpu:gloo,{device_type}:{backend}", which on a CPU
   machine is "cpu:gloo,cpu:gloo"; torch 2.13 refuses it ("Duplicate device type cpu"); it
   becomes "gloo", what the string means there.
"""
import importlib.abc
import importlib.machinery
import os
import sys


def _patch_common_distributed(mod):
    orig = mod.skip_if_lt_x_gpu

    def skip_if_lt_x_gpu(x, *, allow_cpu=True):
        return orig(x, allow_cpu=True)

    skip_if_lt_x_gpu.__doc__ = orig.__doc__
    mod.skip_if_lt_x_gpu = skip_if_lt_x_gpu


def _patch_common_dtensor(mod):
    cls = mod.DTensorTestBase
    orig = cls.init_pg

    def init_pg(self, eager_init, backend=None):
        if backend is None:
            backend = self.backend
        parts = [p.strip() for p in backend.split(",")]
        if len(parts) > 1 and len(set(parts)) == 1 and ":" in parts[0]:
            backend = parts[0].split(":", 1)[1]
        return orig(self, eager_init, backend)

    cls.init_pg = init_pg


_TARGETS = {
    "torch.testing._internal.common_distributed": _patch_common_distributed,
    "torch.testing._internal.distributed._tensor.common_dtensor": _patch_common_dtensor,
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        patch = _TARGETS.pop(name, None)
        if patch is None:
            return None
        if not _TARGETS:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("DCP_TESTS_ALLOW_CPU", "1") != "0":
    sys.meta_path.insert(0, _Finder())
'''

HOOK_PLUGIN = '''\
"""Generated by tools/dcp_tests.py: pytest plugin writing one JSON line per event to $DCP_TESTS_RESULTS
(so that a file killed by the per-file timeout still leaves what it had done)."""
import json
import os
import time

_OUT = os.environ["DCP_TESTS_RESULTS"]


def _w(rec):
    with open(_OUT, "a") as f:
        f.write(json.dumps(rec) + "\\n")


def pytest_collection_modifyitems(session, config, items):
    _w({"event": "collected", "ids": [i.nodeid for i in items]})


def pytest_collectreport(report):
    if report.failed:
        _w({"event": "collect_error", "id": report.nodeid, "longrepr": str(report.longrepr)[-30000:]})


def pytest_runtest_logstart(nodeid, location):
    _w({"event": "start", "id": nodeid, "t": time.time()})


def pytest_runtest_logreport(report):
    rec = {"event": "report", "id": report.nodeid, "when": report.when, "outcome": report.outcome,
           "duration": report.duration}
    if report.failed or report.skipped:
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
        rec["crash"] = crash
        rec["longrepr"] = str(report.longrepr)[-30000:]
    _w(rec)
'''

# ---- the swap ---------------------------------------------------------------------------------------


class SwapError(Exception):
    pass


def swap_source(src: str, filename: str = "<test>") -> tuple[str, list[str], list[str], list[str]]:
    """The test file with ``torch.distributed.checkpoint`` (and its mirrored modules) replaced by
    ``goodput.ckpt`` in its import statements.

    Returns (new source, one line per rewritten statement, warnings about DCP reached in a form that
    is not rewritten, the names kept from DCP under ``KEPT_FROM_DCP``).
    """
    tree = ast.parse(src, filename)
    lines = src.splitlines(keepends=True)
    edits: list[tuple[int, int, int, int, str]] = []  # (line0, col0, line1, col1, new text)
    notes: list[str] = []
    warnings: list[str] = []
    kept: list[str] = []

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hits = [a for a in node.names if a.name in SWAP_MODULES]
            if not hits:
                continue
            if len(node.names) != 1:
                raise SwapError(f"{filename}:{node.lineno}: multi-module import of DCP is not handled")
            a = node.names[0]
            if a.asname is None:
                warnings.append(f"line {node.lineno}: 'import {a.name}' without 'as' is not rewritten (it stays DCP)")
                continue
            new = f"import {SWAP_MODULES[a.name]} as {a.asname}"
            edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, new))
            notes.append(f"line {node.lineno}: import {a.name} as {a.asname}  ->  {new}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            mod = node.module or ""
            if mod in SWAP_MODULES:
                mine = [a for a in node.names if a.name not in KEPT_FROM_DCP]
                theirs = [a for a in node.names if a.name in KEPT_FROM_DCP]
                if any(a.name == "*" for a in node.names):
                    raise SwapError(f"{filename}:{node.lineno}: 'from {mod} import *' is not handled")

                def names(xs: list[ast.alias]) -> str:
                    return ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in xs)

                parts = []
                if mine:
                    parts.append(f"from {SWAP_MODULES[mod]} import ({names(mine)})")
                if theirs:
                    parts.append(f"from {mod} import ({names(theirs)})  # kept: DCP's own, see KEPT_FROM_DCP")
                    kept += [a.asname or a.name for a in theirs]
                indent = " " * node.col_offset
                new = ("\n" + indent).join(parts)
                edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, new))
                notes.append(
                    f"line {node.lineno}: from {mod} import {names(node.names)}  ->  "
                    + (f"from {SWAP_MODULES[mod]} import {names(mine)}" if mine else "")
                    + (f"{'; ' if mine else ''}kept from DCP: {names(theirs)}" if theirs else "")
                )
            elif mod == "torch.distributed" and any(a.name == "checkpoint" for a in node.names):
                warnings.append(f"line {node.lineno}: 'from torch.distributed import checkpoint' is not rewritten")
        elif isinstance(node, ast.Attribute) and _dotted(node.value) == DCP:
            warnings.append(f"line {node.lineno}: {DCP}.{node.attr} is reached through an unrewritten name")

    # apply bottom-up so that offsets stay valid
    for l0, c0, l1, c1, new in sorted(edits, reverse=True):
        head = lines[l0 - 1][:c0]
        tail = lines[l1 - 1][c1:]
        lines[l0 - 1 : l1] = [head + new + tail]
    return "".join(lines), notes, warnings, sorted(set(kept))


def kept_name_users(src: str, kept: list[str]) -> dict[str, list[str]]:
    """``"Class::test_fn"`` (or ``"test_fn"``) -> the kept DCP names its body uses."""
    if not kept:
        return {}
    tree = ast.parse(src)
    out: dict[str, list[str]] = {}

    def used(fn: ast.AST) -> list[str]:
        return sorted({n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in kept})

    for node in tree.body:
        fns = []
        if isinstance(node, ast.ClassDef):
            fns = [
                (f"{node.name}::{f.name}", f)
                for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fns = [(node.name, node)]
        for key, fn in fns:
            if fn.name.startswith("test"):
                names = used(fn)
                if names:
                    out[key] = names
    return out


def kept_reason(test_id: str, users: dict[str, list[str]]) -> str | None:
    """The kept-name reason for a collected test id (parametrized ids carry a suffix)."""
    tail = test_id.split("::", 1)[1] if "::" in test_id else test_id
    for key, names in users.items():
        cls, _, fn = key.rpartition("::")
        t_cls, _, t_fn = tail.rpartition("::")
        if cls == t_cls and (t_fn == fn or t_fn.startswith(fn + "_")):
            return "uses " + "; ".join(KEPT_FROM_DCP[n] for n in names)
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


# ---- running ----------------------------------------------------------------------------------------


# what the upstream test files need that the torch wheel does not bring: torch.testing._internal.common_utils
# imports expecttest; test_dtensor_resharding.py builds ZStandard() while defining a class, which needs zstandard
TEST_DEPS = {"expecttest": "expecttest", "zstandard": "zstandard"}


def ensure_test_deps(scratch: Path) -> Path:
    """pip-installs into <scratch>/deps (on PYTHONPATH for both runs) what the interpreter lacks."""
    deps = scratch / "deps"
    missing = []
    for module, package in TEST_DEPS.items():
        found = (deps / module).exists() or subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True
        ).returncode == 0
        if not found:
            missing.append(package)
    if missing:
        print(f"installing {', '.join(missing)} into {deps} (pip --target)", file=sys.stderr, flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--target",
                str(deps),
                *missing,
            ],
            check=True,
        )
    return deps


def unfinished(results: Path, asked: list[str] | None = None) -> list[str]:
    """Tests a run collected (or was asked for) but did not finish: cut off by the file timeout."""
    res = read_results(results)
    left = [i for i, t in res.items() if t["outcome"] in ("timeout", "not run") and i != "<collection>"]
    return [i for i in left if asked is None or i in asked]


def run_with_resume(
    side: str, test_file: Path, cwd: Path, results: Path, env: dict, timeout: float, ids: list[str] | None
) -> dict:
    """A file's run; when the file timeout cuts it off, the tests it did not reach run once more in
    a second pytest, their results appended (under load a slow file is otherwise counted short)."""
    r = run_pytest(side, test_file, cwd, results, env, timeout, ids)
    if r["timed_out"]:
        left = unfinished(results, ids)
        if left:
            print(
                f"   {side}: timed out; running the {len(left)} test(s) not finished again", file=sys.stderr, flush=True
            )
            r2 = run_pytest(side, test_file, cwd, results, env, timeout, left, append=True)
            r = dict(r, resumed=r2)
    return r


def run_pytest(
    side: str,
    test_file: Path,
    cwd: Path,
    results: Path,
    env: dict,
    timeout: float,
    ids: list[str] | None,
    append: bool = False,
) -> dict:
    if results.exists() and not append:
        results.unlink()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "dcp_results_plugin", "-o", "addopts="]
    cmd += ["--rootdir", str(cwd), "-c", os.devnull]
    if ids is not None:
        if not ids:
            raise ValueError(f"{test_file}: an empty list of test ids would run every file under {cwd}")
        cmd += ids  # node ids relative to cwd
    else:
        cmd.append(str(test_file))
    env = dict(env, DCP_TESTS_RESULTS=str(results))
    t0 = time.time()
    log = results.with_suffix(".out")
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    # the group may still hold spawned ranks
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    return {
        "side": side,
        "file": str(test_file),
        "rc": p.returncode,
        "timed_out": timed_out,
        "elapsed_s": round(time.time() - t0, 1),
        "log": str(log),
    }


def read_results(path: Path) -> dict[str, dict]:
    """node id -> {"outcome": passed|failed|skipped|error|timeout|not run, "error": first line, ...}"""
    tests: dict[str, dict] = {}
    started = None
    if not path.exists():
        return tests
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        ev = rec["event"]
        if ev == "collected":
            for i in rec["ids"]:
                tests.setdefault(i, {"outcome": "not run"})
        elif ev == "collect_error":
            full = first_error(rec["longrepr"], None)
            tests[rec["id"] or "<collection>"] = {"outcome": "error", "error": _clip(full), "error_full": full}
        elif ev == "start":
            started = rec["id"]
            tests.setdefault(started, {"outcome": "not run"})["outcome"] = "timeout"
        elif ev == "report":
            t = tests.setdefault(rec["id"], {"outcome": "not run"})
            t["duration"] = round(t.get("duration", 0) + rec["duration"], 2)
            when, outcome = rec["when"], rec["outcome"]
            if outcome == "failed":
                t["outcome"] = "failed" if when == "call" else "error"
                full = first_error(rec.get("longrepr") or "", rec.get("crash"))
                t["error"], t["error_full"] = _clip(full), full
            elif outcome == "skipped":
                t["outcome"] = "skipped"
                t["error"] = _skip_reason(rec.get("longrepr") or "")
            elif when == "call" and t["outcome"] not in ("failed", "error", "skipped"):
                t["outcome"] = "passed"
            elif when == "teardown" and t["outcome"] == "timeout":  # set up, torn down, never called
                t["outcome"] = "error"
    return tests


_EXC = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Failure)|AssertionError|KeyError"
    r"|StopIteration|CheckpointException|SkipTest)(?::\s?(.*))?$"
)


def first_error(longrepr: str, crash: str | None) -> str:
    """The line that says what went wrong: inside a rank's traceback when the failure came from a
    spawned process (MultiProcessTestCase reports 'Process N exited with error code 10 and exception:').
    An AssertionError gets the test's own line that raised it appended, as ``[at: ...]``."""
    for text in ([crash.splitlines()] if crash else []) + [[re.sub(r"^E\s+", "", ln) for ln in longrepr.splitlines()]]:
        blocks, cur = [], None
        for ln in text:
            if re.match(r"^(RuntimeError: )?Process \d+ exited with error code", ln.strip()):
                cur = []
                blocks.append(cur)
                continue
            if cur is not None:
                if ln.strip().startswith("To execute this test, run"):
                    cur = None
                    continue
                cur.append(ln)
        for blk in blocks:
            hits = [i for i, ln in enumerate(blk) if _EXC.match(ln)]
            if hits:
                return _with_site(blk, hits[-1])
    text = [re.sub(r"^E\s+", "", ln) for ln in longrepr.splitlines()]
    if crash:
        line = crash.splitlines()[0]
        if line.startswith("AssertionError"):
            frames = [i for i, ln in enumerate(text) if _frame_in_test(ln)]
            if frames and frames[-1] + 1 < len(text):
                return f"{line} [at: {text[frames[-1] + 1].strip()}]"
        return line
    hits = [i for i, ln in enumerate(text) if _EXC.match(ln) and "exited with error code" not in ln]
    return _with_site(text, hits[-1]) if hits else (text[-1] if text else "")


def _frame_in_test(line: str) -> bool:
    m = re.match(r'^\s*File "([^"]+)", line \d+, in ', line)
    return (
        bool(m)
        and "site-packages" not in m.group(1)
        and "/lib/python" not in m.group(1)
        and "/goodput/ckpt/" not in m.group(1)
    )


def _with_site(lines: list[str], i: int) -> str:
    line = lines[i].strip()
    if line.startswith("AssertionError"):
        frames = [j for j in range(i) if _frame_in_test(lines[j])]
        if frames and frames[-1] + 1 < i:
            return f"{line} [at: {lines[frames[-1] + 1].strip()}]"
    return line


def _skip_reason(longrepr: str) -> str:
    m = re.search(r"Skipped: (.*?)['\")]*$", longrepr)
    return _clip(m.group(1) if m else longrepr)


def _clip(s: str, n: int = 300) -> str:
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= n else s[: n - 3] + "..."


def cause_of(err: str) -> str:
    """A failure's first line as a grouping key: goodput's SaveError reduced to the first rank's message,
    long reprs in parentheses elided, and what varies between tests (paths, numbers, addresses) replaced."""
    s = err
    m = re.match(
        r"^(?:[\w.]*\.)?SaveError: save to .*? failed; nothing was committed\. rank \d+: (.*?)(?:; rank \d+: .*)?$", s
    )
    if m:
        s = "SaveError: " + m.group(1)
    while True:  # innermost (...) longer than 30 characters -> (...)
        t = re.sub(r"\((?=[^()]{30,}\))[^()]*\)", "(...)", s)
        if t == s:
            break
        s = t
    s = re.sub(r"/tmp/[^\s'\"]+|/(?:work|root|home)/[^\s'\"]+", "<path>", s)
    s = re.sub(r"'[\w.\[\]-]+': ", "'<key>': ", s)  # goodput names the state-dict key first
    s = re.sub(r"0x[0-9a-fA-F]+", "<addr>", s)
    s = re.sub(r"(?<![\w.])\d+(\.\d+)?(?![\w])", "<n>", s)
    s = re.sub(r"\[<n>(?:, <n>)*\]", "[...]", s)
    s = re.sub(r"\(<n>(?:, <n>)*,?\)", "(...)", s)
    return _clip(s)


def internal_reason(test_id: str) -> str | None:
    for pat, reason in INTERNALS:
        if re.search(pat, test_id):
            return reason
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("paths", nargs="*", default=["/tmp/dcp-tests/upstream"], help="upstream test files or directories")
    ap.add_argument("--scratch", default="/tmp/dcp-tests/run", help="where copies and results go")
    ap.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the JSON summary (to stdout if no PATH)",
    )
    ap.add_argument("--side", choices=["both", "dcp", "goodput"], default="both")
    ap.add_argument("--rerun-dcp", action="store_true", help="run DCP again even if results for these file bytes exist")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="reusing DCP's results, first run under DCP the tests an earlier run did not finish (file timeout)",
    )
    ap.add_argument(
        "--goodput-all", action="store_true", help="run every test under goodput, not only those DCP passes"
    )
    ap.add_argument("--file-timeout", type=float, default=600, help="seconds per file and side (default 600)")
    ap.add_argument("--test-timeout", type=int, default=90, help="DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (default 90)")
    ap.add_argument(
        "--no-cpu-gate-patch", action="store_true", help="leave skip_if_lt_x_gpu as it is (GPU-gated tests skip)"
    )
    ap.add_argument(
        "--report-only", action="store_true", help="run nothing: the table and summary from the last results"
    )
    ap.add_argument(
        "-k",
        dest="keyword",
        action="append",
        default=None,
        help="only test ids containing this substring (repeatable: any)",
    )
    args = ap.parse_args(argv)

    t_start = time.time()
    files: list[tuple[Path, Path]] = []  # (absolute file, path relative to its root)
    for p in map(Path, args.paths):
        p = p.resolve()
        if p.is_dir():
            files += [(f, f.relative_to(p)) for f in sorted(p.rglob("test_*.py"))]
        elif p.is_file():
            files.append((p, Path(p.name)))
        else:
            ap.error(f"no such file or directory: {p}")
    if not files:
        ap.error("no test files found")
    repo = Path(__file__).resolve().parent.parent
    scratch = Path(args.scratch).resolve()
    if scratch == repo or repo in scratch.parents:
        ap.error("--scratch must be outside the repository")
    for d in ("dcp", "goodput", "hooks", "results/dcp", "results/goodput"):
        (scratch / d).mkdir(parents=True, exist_ok=True)

    hooks = scratch / "hooks"
    (hooks / "sitecustomize.py").write_text(HOOK_SITECUSTOMIZE)
    (hooks / "dcp_results_plugin.py").write_text(HOOK_PLUGIN)
    deps = ensure_test_deps(scratch)

    base_path = [str(hooks), str(deps)]
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    env.update(
        PYTHONUNBUFFERED="1",
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.test_timeout),
        DCP_TESTS_ALLOW_CPU="0" if args.no_cpu_gate_patch else "1",
        OMP_NUM_THREADS="1",
    )
    env_dcp = dict(env, PYTHONPATH=os.pathsep.join(base_path + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env_gp = env_dcp  # the same environment: only the swapped imports differ

    runs, per_file = [], {}
    for src, rel in files:
        data = src.read_bytes()
        # DCP results are reused only for the same file bytes, torch and environment hooks
        env_key = (
            f"{_torch_version()}|{HOOK_SITECUSTOMIZE}|{sorted(TEST_DEPS)}|{args.test_timeout}|{args.no_cpu_gate_patch}"
        )
        digest = hashlib.sha256(data + env_key.encode()).hexdigest()[:16]
        key = str(rel)
        dcp_copy = scratch / "dcp" / rel
        gp_copy = scratch / "goodput" / rel
        dcp_copy.parent.mkdir(parents=True, exist_ok=True)
        gp_copy.parent.mkdir(parents=True, exist_ok=True)
        dcp_copy.write_bytes(data)
        new, notes, warns, kept = swap_source(data.decode(), str(rel))
        users = kept_name_users(data.decode(), kept)
        gp_copy.write_text(new)
        diff = "".join(
            difflib.unified_diff(data.decode().splitlines(True), new.splitlines(True), f"dcp/{rel}", f"goodput/{rel}")
        )
        gp_copy.with_suffix(".swap.diff").write_text(diff)
        stem = str(rel).replace("/", "__").removesuffix(".py")
        res_dcp = scratch / "results" / "dcp" / f"{stem}.jsonl"
        res_gp = scratch / "results" / "goodput" / f"{stem}.jsonl"
        stamp = res_dcp.with_suffix(".sha")
        per_file[key] = {
            "sha256_16": digest,
            "swap": notes,
            "swap_warnings": warns,
            "kept_from_dcp": kept,
            "tests_using_kept_names": users,
        }
        print(
            f"== {rel}  ({len(notes)} import(s) swapped{', ' + str(len(warns)) + ' warning(s)' if warns else ''})",
            file=sys.stderr,
            flush=True,
        )
        for w in warns:
            print(f"   warning: {w}", file=sys.stderr, flush=True)

        if args.report_only:
            continue
        ids_filter = args.keyword or None
        if args.side in ("both", "dcp"):
            # (a cached full run also serves -k: its results hold every test)
            cached = stamp.exists() and stamp.read_text() == digest and res_dcp.exists() and not args.rerun_dcp
            if cached:
                print("   dcp: reusing earlier results for these bytes", file=sys.stderr, flush=True)
                per_file[key]["dcp_run"] = {"cached": True}
                left = unfinished(res_dcp) if args.resume else []
                if left:  # a cached run cut off by its file timeout: finish it
                    print(f"   dcp: running the {len(left)} test(s) it did not finish", file=sys.stderr, flush=True)
                    r = run_pytest("dcp", rel, scratch / "dcp", res_dcp, env_dcp, args.file_timeout, left, append=True)
                    per_file[key]["dcp_run"] = {"cached": True, "resumed": r}
                    runs.append(r)
            else:
                ids = _select(scratch / "dcp", rel, env_dcp, ids_filter)
                if ids == []:  # -k matched nothing here (pytest given no id would run the whole scratch side)
                    print("   dcp: no test id matches -k here", file=sys.stderr, flush=True)
                    res_dcp.unlink(missing_ok=True)
                    stamp.unlink(missing_ok=True)
                    continue
                r = run_with_resume("dcp", rel, scratch / "dcp", res_dcp, env_dcp, args.file_timeout, ids)
                per_file[key]["dcp_run"] = r
                runs.append(r)
                if args.keyword:  # a partial run: the next full run must not reuse it
                    stamp.unlink(missing_ok=True)
                else:
                    stamp.write_text(digest)
                print(
                    f"   dcp: rc={r['rc']} {r['elapsed_s']}s{' TIMED OUT' if r['timed_out'] else ''}",
                    file=sys.stderr,
                    flush=True,
                )
        if args.side in ("both", "goodput"):
            dres = read_results(res_dcp)
            if args.goodput_all or not dres:
                ids = _select(scratch / "goodput", rel, env_gp, ids_filter)
            else:
                ids = [i for i, t in dres.items() if t["outcome"] == "passed" and _matches(i, ids_filter)]
            if ids == []:
                print("   goodput: nothing to run (no test passes under DCP)", file=sys.stderr, flush=True)
                if res_gp.exists():
                    res_gp.unlink()
                continue
            res_gp.with_suffix(".sha").write_text(_tree_digest(repo / "goodput" / "ckpt"))  # the code this run tests
            r = run_with_resume("goodput", rel, scratch / "goodput", res_gp, env_gp, args.file_timeout, ids)
            per_file[key]["goodput_run"] = r
            runs.append(r)
            print(
                f"   goodput: rc={r['rc']} {r['elapsed_s']}s{' TIMED OUT' if r['timed_out'] else ''}",
                file=sys.stderr,
                flush=True,
            )

    # ---- collect --------------------------------------------------------------------------------------
    tests = []
    gp_code: dict[str, str] = {}
    for _src, rel in files:
        stem = str(rel).replace("/", "__").removesuffix(".py")
        sha = scratch / "results" / "goodput" / f"{stem}.sha"
        if sha.exists():
            gp_code[str(rel)] = sha.read_text().strip()
        d = read_results(scratch / "results" / "dcp" / f"{stem}.jsonl")
        g = read_results(scratch / "results" / "goodput" / f"{stem}.jsonl")
        for tid in sorted(set(d) | set(g)):
            if not _matches(tid, args.keyword):
                continue
            dt, gt = d.get(tid, {"outcome": "not run"}), g.get(tid, {"outcome": "not run"})
            tests.append(
                {
                    "id": tid,
                    "file": str(rel),
                    "dcp": dt["outcome"],
                    "dcp_error": dt.get("error"),
                    "goodput": gt["outcome"],
                    "goodput_error": gt.get("error"),
                    "cause": cause_of(gt.get("error_full") or gt["outcome"])
                    if gt["outcome"] not in ("passed", "not run")
                    else None,
                    "internal": internal_reason(tid)
                    or kept_reason(tid, per_file.get(str(rel), {}).get("tests_using_kept_names", {})),
                }
            )
    dcp_pass = [t for t in tests if t["dcp"] == "passed"]
    goal = [t for t in dcp_pass if not t["internal"]]
    gp_pass = [t for t in dcp_pass if t["goodput"] == "passed"]
    goal_pass = [t for t in goal if t["goodput"] == "passed"]
    causes: dict[str, list[dict]] = collections.defaultdict(list)
    for t in dcp_pass:
        if t["goodput"] != "passed":
            causes[t["cause"] or t["goodput"]].append(t)
    summary = {
        "collected": len(tests),
        "dcp": dict(collections.Counter(t["dcp"] for t in tests)),
        "dcp_passed": len(dcp_pass),
        "goodput_passed_of_dcp_passed": len(gp_pass),
        "dcp_internals_among_dcp_passed": len(dcp_pass) - len(goal),
        "goal_tests": len(goal),
        "goal_passed": len(goal_pass),
        "elapsed_s": round(time.time() - t_start, 1),
    }
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "python": sys.version.split()[0],
        "torch": _torch_version(),
        # fingerprint of goodput/ckpt/*.py when each file's goodput run started (others edit it meanwhile)
        "goodput_ckpt_sha256_16": sorted(set(gp_code.values())),
        "goodput_ckpt_sha256_16_by_file": gp_code,
        "scratch": str(scratch),
        "summary": summary,
        "causes": [
            {
                "cause": c,
                "count": len(ts),
                "internal": sum(1 for t in ts if t["internal"]),
                "example": ts[0]["id"],
                "first_line": ts[0]["goodput_error"],
                "tests": [t["id"] for t in ts],
            }
            for c, ts in sorted(causes.items(), key=lambda kv: -len(kv[1]))
        ],
        "files": per_file,
        "runs": runs,
        "tests": tests,
    }

    # ---- print ------------------------------------------------------------------------------------------
    if args.json != "-":
        _print_table(tests, out)
    if args.json:
        text = json.dumps(out, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
            print(f"\nJSON summary: {args.json}")
    return 0


def _matches(tid: str, keywords: list[str] | None) -> bool:
    return not keywords or any(k in tid for k in keywords)


def _select(cwd: Path, rel: Path, env: dict, keyword: list[str] | None) -> list[str] | None:
    if not keyword:
        return None
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "--collect-only",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-c",
        os.devnull,
        "--rootdir",
        str(cwd),
        str(rel),
    ]
    p = subprocess.run(cmd, cwd=cwd, env=dict(env, DCP_TESTS_RESULTS=os.devnull), capture_output=True, text=True)
    return [ln.strip() for ln in p.stdout.splitlines() if "::" in ln and _matches(ln, keyword)]


def _tree_digest(d: Path) -> str:
    """A fingerprint of goodput/ckpt's sources as they were when the run ended (they may be edited meanwhile)."""
    h = hashlib.sha256()
    for f in sorted(d.rglob("*.py")):
        h.update(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except Exception:  # pragma: no cover
        return "?"


def _print_table(tests: list[dict], out: dict) -> None:
    short = {"passed": "pass", "failed": "FAIL", "skipped": "skip", "error": "ERR", "timeout": "TIME", "not run": "-"}
    w = max([len(t["id"]) for t in tests] + [10])
    print()
    print(f"{'test':<{w}}  {'dcp':<4}  {'goodput':<7}  first line of the goodput failure / note")
    for t in tests:
        g = short[t["goodput"]]
        note = ""
        if t["goodput"] not in ("passed", "not run"):
            note = t["goodput_error"] or ""
        elif t["dcp"] != "passed":
            note = f"(dcp: {t['dcp_error'] or t['dcp']})"
        if t["internal"]:
            note = f"[not in the goal: {t['internal']}] " + note
        print(f"{t['id']:<{w}}  {short[t['dcp']]:<4}  {g:<7}  {note}")
    s = out["summary"]
    print()
    print(f"collected {s['collected']}; under DCP: {s['dcp']}")
    print(f"passed under DCP: {s['dcp_passed']}")
    print(
        f"  of those, passed under goodput (import goodput.ckpt as dcp, nothing else): {s['goodput_passed_of_dcp_passed']}"
    )
    print(
        f"  left out of the goal (DCP's private API, each with its reason): {s['dcp_internals_among_dcp_passed']}; "
        f"goal: {s['goal_passed']} / {s['goal_tests']} pass under goodput"
    )
    if out["causes"]:
        print("\ngoodput failures among DCP passes, by first line:")
        for c in out["causes"]:
            tag = f"  ({c['internal']} of them DCP internals)" if c["internal"] else ""
            print(f"  {c['count']:3d}  {c['cause']}{tag}\n       e.g. {c['example']}")
    print(f"\nelapsed {s['elapsed_s']} s")


if __name__ == "__main__":
    sys.exit(main())
