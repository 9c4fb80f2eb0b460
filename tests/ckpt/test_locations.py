"""Locations that do not exist, and names a checkpoint carries, as the reader and ``goodput ckpt``
answer them: a mistyped path is an error, never "no checkpoint yet, start from step 0"; a
Checkpointer's own root that does not exist yet (a first run) is empty; names print literally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import goodput.ckpt as gc
from goodput.ckpt.errors import StorageError
from goodput.cli.main import app

runner = CliRunner()


def words(r) -> str:  # rich wraps long lines
    return " ".join(r.output.split())


def test_a_missing_root_inside_an_existing_directory_is_empty(tmp_path: Path) -> None:
    assert gc.latest(tmp_path / "not-yet") is None
    assert gc.list_checkpoints(tmp_path / "not-yet") == []
    ck = gc.Checkpointer(tmp_path / "first-run", interval=1, mode="thread")  # a first run works
    try:
        assert ck.restore({"w": torch.zeros(2)}) is None
    finally:
        ck.close()


def test_a_missing_parent_is_an_error(tmp_path: Path) -> None:
    typo = tmp_path / "no-such-dir" / "run"
    with pytest.raises(StorageError, match="does not exist, nor does its parent"):
        gc.latest(typo)
    with pytest.raises(StorageError, match="does not exist, nor does its parent"):
        gc.list_checkpoints(typo)


def test_a_missing_checkpoint_says_whether_the_location_exists(tmp_path: Path) -> None:
    with pytest.raises(gc.CheckpointError, match="is not a committed checkpoint .it does not exist"):
        gc.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(gc.CheckpointError, match=r"is not a committed checkpoint \(no MANIFEST.json\)"):
        gc.open(tmp_path / "empty")
    r = runner.invoke(app, ["ckpt", "verify", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "does not exist" in words(r)


def test_cli_refuses_an_s3_url_without_a_bucket() -> None:
    for cmd in ("verify", "inspect", "ls"):
        r = runner.invoke(app, ["ckpt", cmd, "s3://"])
        assert r.exit_code == 2 and "not an S3 bucket name" in words(r), (cmd, r.output)
        assert "'s3:'" not in r.output  # not taken for a local path


def test_a_missing_bucket_is_said(weed: object) -> None:
    where = "s3://no-such-bucket-4b1d/run"
    with pytest.raises(StorageError, match="NoSuchBucket"):
        gc.latest(where)
    with pytest.raises(StorageError, match="NoSuchBucket"):
        gc.open(where)
    r = runner.invoke(app, ["ckpt", "verify", where])
    assert r.exit_code == 1 and "NoSuchBucket" in words(r) and "no MANIFEST" not in words(r)


NAMES = {"[bold red]markup[/]": 1, "tab\tnew\nline": 1, "日本語.名前": 2}


def test_cli_prints_names_literally(tmp_path: Path) -> None:
    gc.save({k: torch.ones(n) for k, n in NAMES.items()}, tmp_path / "ck", step=1)
    r = runner.invoke(app, ["ckpt", "inspect", str(tmp_path / "ck")])
    assert r.exit_code == 0, r.output
    assert "[bold red]markup[/]" in r.output  # not taken for Rich markup
    (row,) = [ln for ln in r.output.splitlines() if "tab" in ln]
    assert "tab\\tnew\\nline" in row  # one row, the control characters written as escapes
    assert "日本語.名前" in r.output
    r = runner.invoke(app, ["ckpt", "inspect", str(tmp_path / "ck"), "--json"])
    assert {t["name"] for t in json.loads(r.output)["tensors"]} == set(NAMES)  # JSON keeps them as they are
    odd = tmp_path / "[red]run[/]"
    gc.save({"w": torch.ones(1)}, odd / "step_000000001", step=1)
    r = runner.invoke(app, ["ckpt", "ls", str(odd)])
    assert r.exit_code == 0 and "[red]run[/]" in r.output


def test_a_save_refuses_targets_it_would_damage(tmp_path: Path) -> None:
    """An empty path is not the working directory, the filesystem's root gets no MANIFEST.json,
    and a DCP checkpoint's directory is not mixed with goodput's files: each refused by name,
    by the synchronous and the asynchronous save, before anything is written."""
    sd = {"w": torch.ones(3)}
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="path is empty"):
            gc.save(sd, empty)
    with pytest.raises(gc.SaveError, match="filesystem root"):
        gc.save(sd, "/")
    assert not Path("/MANIFEST.json").exists()
    dcp_dir = tmp_path / "dcp"
    dcp_dir.mkdir()
    (dcp_dir / ".metadata").write_bytes(b"DCP")
    before = sorted(p.name for p in dcp_dir.iterdir())
    with pytest.raises(gc.SaveError, match=r"holds a DCP checkpoint.*import-dcp"):
        gc.save(sd, dcp_dir)
    with pytest.raises(gc.SaveError, match=r"holds a DCP checkpoint"):
        gc.async_save(sd, dcp_dir, async_checkpointer_type=None).result()
    assert sorted(p.name for p in dcp_dir.iterdir()) == before
