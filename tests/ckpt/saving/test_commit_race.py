"""Two saves making the first commit of one checkpoint at once (docs/S3.md, "exactly one wins"),
on a file system, made deterministic: another save commits between this save's look for a
manifest (none) and its create. This save fails saying it lost the race and removes its own
files; the winner stays whole. The same with ``overwrite=False``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from goodput.ckpt.storage.local import PosixStorage


def _commit_between_look_and_create(monkeypatch: pytest.MonkeyPatch, where: Path) -> list[int]:
    """Make a real second save commit ``where`` just before this save creates its manifest (after
    it looked: none was there)."""
    real = PosixStorage.publish_new
    fired: list[int] = []

    def publish_new(self: PosixStorage, directory: Path, name: str, data: bytes) -> bool:
        if name == MANIFEST and not fired and Path(directory) == where:
            fired.append(1)
            gc.save({"w": torch.ones(8)}, where, step=2)
        return real(self, directory, name, data)

    monkeypatch.setattr(PosixStorage, "publish_new", publish_new)
    return fired


@pytest.mark.parametrize("overwrite", [True, False])
def test_the_save_that_loses_the_first_commit_says_so_and_leaves_the_winner_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overwrite: bool
) -> None:
    ck = tmp_path / "ck"
    fired = _commit_between_look_and_create(monkeypatch, ck)
    with pytest.raises(gc.CheckpointException, match=f"another save committed '{ck}' first .* lost the race"):
        gc.save({"w": torch.randn(1000)}, storage_writer=gc.FileSystemWriter(str(ck), overwrite=overwrite), step=1)
    assert fired == [1]  # the race happened where it is meant to
    gc.verify(ck)
    c = gc.open(ck)
    assert c.step == 2
    out = {"w": torch.zeros(8)}
    gc.load(out, ck)
    assert torch.equal(out["w"], torch.ones(8))
    names = {p.name for p in ck.iterdir()}
    assert names == {MANIFEST, c.manifest.metadata.name, *(f.name for f in c.metadata.files)}  # the loser's are gone
