"""A step directory whose MANIFEST.json is there but cannot be read (a flipped byte, a newer
format version, an empty or truncated file, a FIFO, a link, a forged file name) is a damaged
checkpoint, not a save that never committed: ``latest()`` skips it saying so, a Checkpointer's
start-up cleanup and its retention never delete it nor count it among those kept, its restore
refuses to resume before it (the run would save over it), and ``list_checkpoints`` /
``goodput ckpt ls`` report it with why."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import torch
from typer.testing import CliRunner

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST, decode_manifest, encode_manifest
from goodput.ckpt.loading.reader import DamagedCheckpointWarning, is_committed, scan_checkpoints
from goodput.cli.main import app

S1, S2, S3 = "step_000000001", "step_000000002", "step_000000003"


def _flip(d: Path) -> None:  # one byte of a sealed field changed: the seal no longer matches
    raw = (d / MANIFEST).read_bytes()
    assert b'"world_size":1' in raw
    (d / MANIFEST).write_bytes(raw.replace(b'"world_size":1', b'"world_size":2'))


def _resealed(d: Path, **fields: object) -> None:  # a correctly sealed manifest with other fields
    m = decode_manifest((d / MANIFEST).read_bytes(), "m")
    (d / MANIFEST).write_bytes(encode_manifest(msgspec.structs.replace(m, **fields)))


def _future(d: Path) -> None:  # written by a newer goodput
    _resealed(d, version=3)


def _dotdot(d: Path) -> None:  # sealed, but names a file outside its directory
    m = decode_manifest((d / MANIFEST).read_bytes(), "m")
    _resealed(d, metadata=msgspec.structs.replace(m.metadata, name=f"../{S2}/{m.metadata.name}"))


def _empty(d: Path) -> None:
    (d / MANIFEST).write_bytes(b"")


def _truncated(d: Path) -> None:
    raw = (d / MANIFEST).read_bytes()
    (d / MANIFEST).write_bytes(raw[: len(raw) // 2])


def _fifo(d: Path) -> None:
    (d / MANIFEST).unlink()
    os.mkfifo(d / MANIFEST)


def _symlink(d: Path) -> None:  # a link to a good manifest is not this directory's commit
    (d / MANIFEST).unlink()
    (d / MANIFEST).symlink_to(d.parent / S2 / MANIFEST)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "flip": _flip,
    "future": _future,
    "dotdot": _dotdot,
    "empty": _empty,
    "truncated": _truncated,
    "fifo": _fifo,
    "symlink": _symlink,
}
WHY = {
    "flip": "checksum does not match",
    "future": "format version 3 is not supported",
    "dotdot": "refusing file name",
    "empty": "not a valid manifest",
    "truncated": "not a valid manifest",
    "fifo": "not a regular file",
    "symlink": "",  # the reader's own words for a link; any reason will do, as long as it is given
}


def _three_steps(root: Path) -> None:
    ck = gc.Checkpointer(root, interval=1, keep=5, mode="thread")
    for s in (1, 2, 3):
        ck.save(s, {"w": torch.full((8,), float(s))}).result()
    ck.close()


@pytest.fixture(params=sorted(DAMAGE))
def damaged_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "run"
    _three_steps(root)
    DAMAGE[request.param](root / S3)
    return root, request.param


def test_latest_skips_it_and_says_so(damaged_root: tuple[Path, str]) -> None:
    root, how = damaged_root
    with pytest.warns(DamagedCheckpointWarning, match=S3) as seen:
        assert gc.latest(root) == root / S2
    assert any(WHY[how] in str(w.message) for w in seen)
    with pytest.warns(DamagedCheckpointWarning, match=S3):
        assert [p.name for p, _ in gc.list_checkpoints(root)] == [S1, S2]
    listing = scan_checkpoints(root)
    assert [d.path.name for d in listing.damaged] == [S3] and WHY[how] in listing.damaged[0].reason


def test_checkpointer_never_deletes_it_nor_counts_it_as_kept(
    damaged_root: tuple[Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    root, how = damaged_root
    (root / "step_000000009").mkdir()  # a save that never committed: still cleaned up
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        # keep=1: were the damaged step 3 counted as the one kept, step 2 would go
        ck = gc.Checkpointer(root, interval=1, keep=1, mode="thread")
    try:
        assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == [S2, S3]
        said = [r.getMessage() for r in caplog.records if S3 in r.getMessage()]
        assert said and all("keeping" in m for m in said) and WHY[how] in said[0]
        state = {"w": torch.zeros(8)}
        # resuming from step 2 would save step 3 over it: refused, naming it, before any work
        with (
            pytest.warns(DamagedCheckpointWarning, match=S3),
            pytest.raises(gc.CheckpointError, match=f"{S3}.* would save over it") as e,
        ):
            ck.restore(state)
        assert WHY[how] in str(e.value) and state["w"][0].item() == 0.0
        ck.save(4, {"w": torch.full((8,), 4.0)}).result()  # retention at a commit spares it too
        caplog.clear()
        ck.save(5, {"w": torch.full((8,), 5.0)}).result()
        assert not [r for r in caplog.records if S3 in r.getMessage()]  # said once, not at every commit
    finally:
        ck.close()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == [S3, "step_000000005"]


def test_the_pointer_naming_it_falls_back_to_the_listing(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _three_steps(root)
    assert (root / "latest").read_text().strip() == S3
    _flip(root / S3)
    with pytest.warns(DamagedCheckpointWarning, match=S3):
        assert gc.latest(root) == root / S2
    # the pointer left behind on step 2 by a crash, and the newer step 3 damaged: said too
    (root / "latest").write_text(S2)
    with pytest.warns(DamagedCheckpointWarning, match=S3):
        assert gc.latest(root) == root / S2


def test_cli_ls_shows_it_with_why(damaged_root: tuple[Path, str]) -> None:
    root, how = damaged_root
    r = CliRunner().invoke(app, ["ckpt", "ls", str(root), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert [(x["step"], x["damaged"]) for x in rows[:2]] == [(1, None), (2, None)]
    assert rows[2]["path"] == str(root / S3) and rows[2]["step"] is None and WHY[how] in rows[2]["damaged"]
    r = CliRunner().invoke(app, ["ckpt", "ls", str(root)])
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and "damaged or unreadable" in out and S3 in out and S2 in out


def test_restore_goes_on_once_it_is_moved_away(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _three_steps(root)
    _future(root / S3)
    (root / S3).rename(tmp_path / "kept-aside")  # what the refusal asks a person to do
    ck = gc.Checkpointer(root, interval=1, keep=5, mode="thread")
    try:
        state = {"w": torch.zeros(8)}
        assert ck.restore(state) == 2 and state["w"][0].item() == 2.0
    finally:
        ck.close()
    assert (tmp_path / "kept-aside" / MANIFEST).exists()


def test_an_older_damaged_step_does_not_stop_a_restore(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _three_steps(root)
    _flip(root / S1)  # older than the newest: nothing will be saved over it
    ck = gc.Checkpointer(root, interval=1, keep=5, mode="thread")
    try:
        assert ck.restore({"w": torch.zeros(8)}) == 3
    finally:
        ck.close()
    assert (root / S1 / MANIFEST).exists()


def test_a_save_that_must_not_overwrite_refuses_it(damaged_root: tuple[Path, str]) -> None:
    """overwrite=False refuses a damaged checkpoint as it refuses a readable one, naming it and
    why, before writing anything: no data written beside it, no commit race to lose."""
    root, how = damaged_root
    target = root / S3
    before = sorted(p.name for p in target.iterdir())
    for save in (gc.save, lambda *a, **k: gc.async_save(*a, **k).result(timeout=60)):
        with pytest.raises(gc.CheckpointError, match=f"{S3}.* cannot be read") as e:
            save(
                {"w": torch.zeros(8)},
                checkpoint_id=str(target),
                storage_writer=gc.FileSystemWriter(str(target), overwrite=False),
            )
        assert WHY[how] in str(e.value) and "overwrite=False" in str(e.value)
        assert sorted(p.name for p in target.iterdir()) == before
    assert not is_committed(root / "elsewhere") and is_committed(root / S2)
    with pytest.raises(gc.CheckpointError, match=S3):
        is_committed(target)
