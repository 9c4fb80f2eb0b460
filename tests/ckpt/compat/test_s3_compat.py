"""import-dcp and export with s3:// on either side (a real SeaweedFS): nothing is written under the
working directory (no ``./s3:/...``), the "not empty" guard looks at the real destination, and
what arrives is exact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from typer.testing import CliRunner

import goodput.ckpt as gc
from goodput.ckpt.storage import s3
from goodput.cli.main import app
from tests.ckpt.s3_server import keys

# ``bucket`` (tests/ckpt/conftest.py): a prefix of the test's own on the session's SeaweedFS


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_import_dcp_to_s3_leaves_no_local_droppings(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "dcp"
    w = torch.randn(64, 8)
    dcp.save({"w": w, "loader": b"\x80pickled", "step": 3}, checkpoint_id=str(src), no_dist=True)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    dest = f"s3://{bucket}/imported"
    r = CliRunner().invoke(app, ["ckpt", "import-dcp", str(src), dest])
    assert r.exit_code == 0, r.output
    assert f"ok: {dest}" in _flat(r.output)
    assert os.listdir(work) == []  # no ./s3:/... directory
    ck = gc.open(dest)
    assert torch.equal(torch.from_numpy(ck.read("w")), w) and ck.values == {"loader": b"\x80pickled", "step": 3}
    r = CliRunner().invoke(app, ["ckpt", "import-dcp", str(src), dest])
    assert r.exit_code == 1 and f"the destination '{dest}' is not empty" in _flat(r.output), r.output
    assert os.listdir(work) == []


def test_export_from_and_to_s3(bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd = {"model": {"a": torch.randn(300, 40), "b": torch.randn(50).bfloat16()}, "step": 1}
    src = f"s3://{bucket}/ck"
    gc.save(sd, src)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    dest = f"s3://{bucket}/hf"
    r = CliRunner().invoke(app, ["ckpt", "export", src, dest, "--prefix", "model.", "--max-shard-size", "10KB"])
    assert r.exit_code == 0, r.output
    assert os.listdir(work) == []
    names = [k.split("/", 1)[1] for k in keys(bucket, "hf/")]
    assert names == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    local = tmp_path / "hf"
    local.mkdir()
    client = s3.default_storage().client()
    name, _, base = bucket.partition("/")
    for n in names:
        client.download_file(name, f"{base}/hf/{n}", str(local / n))
    got = {**load_file(local / names[0]), **load_file(local / names[1])}
    assert (
        set(got) == {"a", "b"} and torch.equal(got["a"], sd["model"]["a"]) and torch.equal(got["b"], sd["model"]["b"])
    )
    r = CliRunner().invoke(app, ["ckpt", "export", src, dest])
    assert r.exit_code == 1 and f"the destination '{dest}' is not empty" in _flat(r.output), r.output
    res = gc.export(src, tmp_path / "local-hf", prefix="model.")  # from s3 to a directory
    assert res.files == ["model.safetensors"] and torch.equal(
        load_file(tmp_path / "local-hf" / "model.safetensors")["a"], sd["model"]["a"]
    )
