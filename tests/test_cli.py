"""The command line over real checkpoints (typer's runner, same process)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner

import goodput.ckpt as gc
from goodput.cli.main import app

runner = CliRunner()


def test_ls_of_a_missing_or_empty_root_says_so(tmp_path: Path) -> None:
    def words(r) -> str:  # rich wraps long lines
        return " ".join(r.output.split())

    r = runner.invoke(app, ["ckpt", "ls", str(tmp_path / "no-such-dir")])
    assert r.exit_code == 2 and "does not exist" in words(r)
    (tmp_path / "file").write_text("x")
    r = runner.invoke(app, ["ckpt", "ls", str(tmp_path / "file")])
    assert r.exit_code == 2 and "is not a directory" in words(r)
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, ["ckpt", "ls", str(tmp_path / "empty")])
    assert r.exit_code == 0 and "no committed checkpoint in" in words(r)
    r = runner.invoke(app, ["ckpt", "ls", str(tmp_path / "empty"), "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == []


def test_ls_inspect_verify(tmp_path: Path) -> None:
    for step in (1, 2):
        gc.save(
            {"w": torch.randn(8, 4), "b": torch.zeros(4, dtype=torch.bfloat16), "lr": 0.1},
            tmp_path / f"s{step}",
            step=step,
        )
    r = runner.invoke(app, ["ckpt", "ls", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert [x["step"] for x in rows] == [1, 2] and rows[0]["tensors"] == 2
    r = runner.invoke(app, ["ckpt", "ls", str(tmp_path)])
    assert r.exit_code == 0 and "s2" in r.output
    r = runner.invoke(app, ["ckpt", "inspect", str(tmp_path / "s2"), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    w = [t for t in info["tensors"] if t["name"] == "w"][0]
    assert w["shape"] == [8, 4] and w["dtype"] == "float32" and w["chunks"][0]["region"] == "[0:8, 0:4]"
    assert info["values"] == {"lr": 0.1} and sum(info["bytes_per_rank"].values()) == 8 * 4 * 4 + 8
    r = runner.invoke(app, ["ckpt", "inspect", str(tmp_path / "s2")])
    assert r.exit_code == 0 and "bfloat16" in r.output
    r = runner.invoke(app, ["ckpt", "verify", str(tmp_path / "s2")])
    assert r.exit_code == 0 and "ok" in r.output


def test_verify_reports_corruption_with_exit_1(tmp_path: Path) -> None:
    gc.save({"w": torch.randn(64, 64)}, tmp_path)
    (f,) = [p for p in tmp_path.iterdir() if p.name.startswith("data-")]
    raw = bytearray(f.read_bytes())
    raw[10] ^= 1
    f.write_bytes(raw)
    r = runner.invoke(app, ["ckpt", "verify", str(tmp_path)])
    assert r.exit_code == 1
    assert "checksum mismatch" in r.output and "'w'" in r.output
    r = runner.invoke(app, ["ckpt", "inspect", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "not a committed checkpoint" in r.output


def test_an_error_quoting_brackets_is_printed_not_read_as_markup(capsys) -> None:  # noqa: ANN001
    """A rank's gloo error quotes "[/__w/pytorch/.../pair.cc:553]": the CLI's error line read it as a
    Rich closing tag and raised MarkupError instead of printing it (CI of 2026-12-03)."""
    import pytest
    import typer

    from goodput.cli import bench, sched

    msg = "rank 1: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed"
    with pytest.raises(typer.Exit):
        bench._fail(RuntimeError(msg))
    with pytest.raises(typer.Exit):
        sched._fail(msg)
    err = capsys.readouterr().err
    assert err.count("pair.cc:553]") == 2


def test_sched_events_relays_every_line_and_returns_the_gap_record_that_ends_a_stream() -> None:
    """`goodput sched events` exits 1 after a stream whose next events the retention deleted: the
    `events_pruned` record that ends it is printed, then returned (a pipeline must not take the
    output for the whole log)."""
    from goodput.cli.sched import relay_events

    printed: list[str] = []
    lines = [b'{"t":1,"event":"submitted","job":"a"}\n', b'{"t":2,"event":"events_pruned","first_seq":9,"since":3}\n']
    gap = relay_events(lines, lambda text, flush: printed.append(text))
    assert gap == {"t": 2, "event": "events_pruned", "first_seq": 9, "since": 3}
    assert printed == [x.decode().rstrip("\n") for x in lines]
    # a job may be called events_pruned: only the record's event field counts
    printed.clear()
    assert (
        relay_events([b'{"t":1,"event":"submitted","job":"events_pruned"}\n'], lambda t, flush: printed.append(t))
        is None
    )
    assert len(printed) == 1
