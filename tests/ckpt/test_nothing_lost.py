"""Nothing lost in silence (issue 25): explicit saves are never skipped, skipped due saves are
reported and made up for, the final step is saved by close(step, state), every value a DCP user
saves comes back as it was (without pickle), a Stateful data loader is saved, and the CLI's
verify --json / piped inspect say all they know. Real saves, real files, a real writer."""

from __future__ import annotations

import json
import logging
import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import goodput.ckpt as gc
from goodput.ckpt.saving.background import SLOW_WRITE_ENV
from goodput.cli.main import app


class Loader:
    """A Stateful data loader whose state is pickled bytes, as torchtitan's."""

    def __init__(self) -> None:
        self.pos = 0

    def state_dict(self) -> dict:
        return {"rank_0": pickle.dumps({"pos": self.pos, "buffer": [1, 2, 3]})}

    def load_state_dict(self, sd: dict) -> None:
        self.pos = pickle.loads(sd["rank_0"])["pos"]  # the user unpickles; goodput never does


def test_skipped_due_saves_are_reported_and_made_up_for(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv(SLOW_WRITE_ENV, "0.4")  # every write lasts longer than several steps
    ck = gc.Checkpointer(tmp_path, interval=1, keep=None, mode="thread")
    events: list = []
    ck.add_listener(events.append, skipped=True)
    commits_only: list = []
    ck.add_listener(commits_only.append)
    state = {"w": torch.zeros(16)}
    saved = []
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        for step in range(1, 16):
            state["w"].fill_(step)
            if ck.maybe_save(step, state) is not None:
                saved.append(step)
            torch.randn(200, 200) @ torch.randn(200, 200)  # a step of work

            time.sleep(0.05)
        h = ck.save(16, state)  # explicit: waits for the write in flight, never skipped
        assert h is not None
        ck.close(17, state)  # the final step: saved and committed before close returns
    skipped = [e for e in events if e.kind == "skipped"]
    committed = [e.step for e in events if e.kind == "commit"]
    assert skipped and all(e.age_s is None or e.age_s >= 0 for e in skipped)
    assert [e.step for e in commits_only] == committed  # commit-only listeners never see a skip
    assert {e.step for e in skipped} | set(saved) == set(range(1, 16))  # every due step: saved or reported
    assert committed == saved + [16, 17]
    assert any("skipped" in r.getMessage() for r in caplog.records)
    # the save after a skip ran as soon as the write ended: never more than one write apart
    for a, b in zip(saved, saved[1:]):
        assert any(e.step == b - 1 for e in skipped) or b == a + 1
    assert gc.latest(tmp_path).name == "step_000000017"
    assert ck.skipped == skipped


@pytest.mark.parametrize("interval", [3, 4])
def test_a_skipped_due_save_is_made_up_at_the_first_step_the_write_allows(
    tmp_path: Path, monkeypatch, interval: int
) -> None:
    """Every few steps due (not every step, so the make-up save is a step the cadence would not
    have saved): after a skip, the first call that finds the writer idle saves, due or not, so
    the newest commit never falls more than one interval and one write behind."""
    # a write spans about 15 steps, several intervals even if the loop runs slow; the steps take
    # uneven times, so that the step a write ends at does not fall on the cadence every time
    # (steps of one length made each write span a whole number of intervals once: nothing off
    # the cadence was left to make up)
    monkeypatch.setenv(SLOW_WRITE_ENV, "0.8")
    pace = random.Random(interval)
    ck = gc.Checkpointer(tmp_path, interval=interval, keep=None, mode="thread")
    events: list = []
    ck.add_listener(events.append, skipped=True)
    state = {"w": torch.zeros(16)}
    saved, idle_and_owed = [], []
    for step in range(1, 61):
        state["w"].fill_(step)
        # read before the call: a write never restarts by itself, so an idle writer seen here is
        # idle when maybe_save looks, and a save owed then must happen at this step
        ck.saver.retire()
        if ck._owed and not ck.saver.busy():
            idle_and_owed.append(step)
        if ck.maybe_save(step, state) is not None:
            saved.append(step)
        time.sleep(pace.uniform(0.02, 0.09))
    ck.close(61, state)
    skipped = [e for e in events if e.kind == "skipped"]
    commits = [e for e in events if e.kind == "commit"]
    assert skipped, "the write never outlasted an interval: the test proved nothing"
    made_up = [s for s in saved if s % interval]
    assert made_up, "no save outside the cadence: nothing was made up"
    assert set(idle_and_owed) <= set(saved)  # owed and possible: saved at that very step
    for s in made_up:  # a save off the cadence follows a skip, with no due save since
        before = [e.step for e in skipped if e.step < s]
        assert before and not [d for d in saved if before[-1] < d < s], (s, before, saved)
    assert {e.step for e in skipped} | {s for s in saved if s % interval == 0} == set(
        range(interval, 61, interval)
    )  # every due step: saved or reported
    assert [e.step for e in commits] == saved + [61]
    for e in skipped:  # the age and step of the newest commit at the skip, as the commits say
        # (a commit whose event is stamped within 10 ms of the skip may land on either side)
        older = [c for c in commits if c.time <= e.time + 0.01]
        could = [c for c in older if c.time > e.time - 0.01] + [c for c in older if c.time <= e.time - 0.01][-1:]
        if e.newest_step is None:
            assert e.age_s is None and not [c for c in older if c.time <= e.time - 0.01]
            continue
        match = [c for c in could if c.step == e.newest_step]
        assert match, (e, [c.step for c in could])
        assert e.age_s == pytest.approx(e.time - match[0].time, abs=0.05)
    assert gc.latest(tmp_path).name == "step_000000061"


def test_close_with_the_final_step_raises_when_it_fails(tmp_path: Path) -> None:
    ck = gc.Checkpointer(tmp_path, interval=100, mode="thread")
    with pytest.raises(gc.SaveError, match="'o'"):
        ck.close(5, {"o": object()})
    assert gc.latest(tmp_path) is None
    with pytest.raises(TypeError, match="needs the state"):
        gc.Checkpointer(tmp_path / "b", interval=100, mode="thread").close(5)


VALUES = {
    "bytes": pickle.dumps({"pos": 7}),
    "bytearray": bytearray(b"\x00\xff"),
    "f32": np.float32(1.25),
    "f64_nan": np.float64("nan"),
    "i8": np.int8(-3),
    "u64": np.uint64(2**64 - 1),
    "bool_": np.bool_(True),
    "c64": np.complex64(1 - 2j),
    "dtype": torch.bfloat16,
    "device": torch.device("cuda", 1),
    "size": torch.Size([2, 3]),
    "big": 2**200 + 1,
    "negbig": -(2**64),
    "tuple": (1, [2, (3, 4)]),
    "list": [1, (2,)],
    "complex": 3 - 4j,
    "tag_lookalike": [{"__bytes__": "not base64!"}],
}


def test_every_dcp_value_comes_back_as_it_was(tmp_path: Path) -> None:
    gc.save({"v": dict(VALUES), "w": torch.ones(2)}, tmp_path / "c")
    got: dict = {"v": dict.fromkeys(VALUES), "w": torch.zeros(2)}
    gc.load(got, tmp_path / "c")
    for k, want in VALUES.items():
        g = got["v"][k]
        assert type(g) is (bytes if k == "bytearray" else type(want)), (k, g)
        if k == "f64_nan":
            assert np.isnan(g)
        else:
            assert g == want, (k, g)
    # the torch-free reader gives them too
    assert gc.open(tmp_path / "c").values["v.size"] == torch.Size([2, 3])


def test_other_objects_are_refused_naming_the_key_and_how(tmp_path: Path) -> None:
    for bad, where in (({"a": {"b": [1, object()]}}, r"'a\.b\[1\]'"), ({"d": np.datetime64("2020")}, "'d'")):
        with pytest.raises(gc.SaveError, match=rf"{where}.*state_dict\(\).*bytes"):
            gc.save(bad, tmp_path / "x")


def test_a_stateful_data_loader_is_saved_and_restored(tmp_path: Path) -> None:
    loader = Loader()
    loader.pos = 42
    ck = gc.Checkpointer(tmp_path, interval=1, mode="thread", data=loader)
    ck.save(1, {"w": torch.ones(3)}).result()
    ck.close()
    fresh = Loader()
    ck2 = gc.Checkpointer(tmp_path, interval=1, mode="thread")
    assert ck2.restore({"w": torch.zeros(3)}, data=fresh) == 1
    ck2.close()
    assert fresh.pos == 42


def test_verify_json_and_piped_inspect(tmp_path: Path) -> None:
    long = "app.model.layers.17.attention.query_key_value.weight_with_a_long_name"
    gc.save({long: torch.ones(4)}, tmp_path / "c")
    runner = CliRunner()
    r = runner.invoke(app, ["ckpt", "verify", "--json", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["ok"] is True and out["bytes"] == 16 and out["tensors"] == 1 and out["sealed"] is True
    r = runner.invoke(app, ["ckpt", "inspect", str(tmp_path / "c")])
    assert r.exit_code == 0 and long in r.output, r.output  # not a terminal: never cut
    data = next((tmp_path / "c").glob("data-*"))
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    r = runner.invoke(app, ["ckpt", "verify", "--json", str(tmp_path / "c")])
    out = json.loads(r.output)
    assert r.exit_code == 1 and out["ok"] is False and "checksum" in out["error"].lower()


RESOURCES = r"""
import sys, torch, goodput.ckpt as gc
d = sys.argv[1]
gc.save({"w": torch.ones(10), "b": b"x"}, d + "/a", step=1)
gc.load({"w": torch.zeros(10), "b": None}, d + "/a")
gc.async_save({"w": torch.ones(10)}, d + "/b").result()
saver = gc.AsyncSaver(mode="process", staging="lazy")
saver.save({"w": torch.ones(1 << 16)}, d + "/c").result()
saver.close()
ck = gc.Checkpointer(d + "/r", interval=1)
ck.maybe_save(1, {"w": torch.ones(10)})
ck.close(2, {"w": torch.ones(10)})
ck = gc.Checkpointer(d + "/r", interval=1)
ck.restore({"w": torch.zeros(10)})
ck.close()
gc.open(gc.latest(d + "/r")).verify()
# the ways in and out: safetensors export and load, a DCP import, the CLI's read-only commands
gc.export(d + "/a", d + "/hf", prefix="")
gc.load({"w": torch.zeros(10)}, d + "/hf", strict=False)
gc.export(d + "/a", d + "/a.pt", format="torch")
import torch.distributed.checkpoint as dcp
from goodput.ckpt.compat.dcp_import import import_dcp
dcp.save({"w": torch.ones(10), "b": b"x"}, checkpoint_id=d + "/dcp")
import_dcp(d + "/dcp", d + "/imported")
from typer.testing import CliRunner
from goodput.cli.main import app
for args in (["ls", d + "/r"], ["inspect", d + "/a"], ["verify", "--json", d + "/a"]):
    res = CliRunner().invoke(app, ["ckpt", *args])  # its stderr is the runner's buffer
    assert res.exit_code == 0 and "ResourceWarning" not in res.output, (args, res.output)
"""


def test_no_resource_warnings(tmp_path: Path) -> None:
    """Files, pipes and the writer process are all closed: a real interpreter in development
    mode (every ResourceWarning shown, destructors included) prints none."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "always::ResourceWarning", "-c", RESOURCES, str(tmp_path)],
        capture_output=True, text=True, cwd=repo, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ResourceWarning" not in r.stderr, r.stderr[-2000:]


def _latest_as_other_user(root: Path) -> str:
    """``latest(root)`` in a process that permissions apply to (root's do not): what it returned
    or raised, as text."""
    import os

    from goodput.ckpt.loading.reader import latest

    if os.geteuid() != 0:
        try:
            return f"returned {latest(root)}"
        except Exception as e:  # noqa: BLE001 - the test reads what it was
            return f"raised {type(e).__name__}: {e}"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                out = f"returned {latest(root)}"
            except Exception as e:  # noqa: BLE001
                out = f"raised {type(e).__name__}: {e}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_latest_never_reads_an_unreadable_or_wrong_location_as_no_checkpoint(tmp_path: Path) -> None:
    import shutil
    import tempfile

    from goodput.ckpt.errors import StorageError
    from goodput.ckpt.loading.reader import latest

    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    with pytest.raises(StorageError, match="not a directory"):
        latest(a_file)  # a resume pointed at a file is a mistake, not a first run
    assert latest(tmp_path / "missing") is None  # a first run

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # reachable by another user, unlike tmp_path
    try:
        base.chmod(0o755)
        root = base / "run"
        root.mkdir()
        root.chmod(0o755)
        gc.save({"t": torch.zeros(1)}, root / "step_000000001")
        (root / "lost+found").mkdir(mode=0o700)  # someone else's, unreadable: skipped with a word
        (root / "lost+found").chmod(0o000)
        assert _latest_as_other_user(root) == f"returned {root / 'step_000000001'}"
        (root / "step_000000001").chmod(0o000)  # the checkpoint is there, the reader cannot see it
        out = _latest_as_other_user(root)
        assert out.startswith("raised StorageError") and "Permission denied" in out, out
        root.chmod(0o000)
        out = _latest_as_other_user(root)
        assert out.startswith("raised StorageError") and "Permission denied" in out, out
    finally:
        for p in (base / "run", base / "run" / "step_000000001", base / "run" / "lost+found"):
            if p.exists() or p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_a_skipped_due_save_a_plain_close_leaves_unmade_is_said(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv(SLOW_WRITE_ENV, "0.5")
    ck = gc.Checkpointer(tmp_path, interval=1, keep=None, mode="thread")
    state = {"w": torch.zeros(16)}
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        assert ck.maybe_save(1, state) is not None
        assert ck.maybe_save(2, state) is None  # the last step of the run, skipped: step 1 is in flight
        ck.close()  # a plain close does not save it, and says so
    said = [r.getMessage() for r in caplog.records if "run ended before it was made up" in r.getMessage()]
    assert said and "step 2" in said[0] and "step 1" in said[0]
    assert gc.latest(tmp_path).name == "step_000000001"
