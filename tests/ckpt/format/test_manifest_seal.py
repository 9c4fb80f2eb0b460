"""The manifest is checksummed like every other byte: one flipped bit in it is caught."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from goodput.ckpt.loading.reader import UnsealedManifestWarning


@pytest.fixture
def ck(tmp_path: Path) -> Path:
    path = tmp_path / "ck"
    gc.save({"x": torch.arange(6.0)}, path, step=100, user={"tokens": 12345})
    return path


def test_a_fresh_manifest_is_sealed(ck: Path) -> None:
    raw = (ck / MANIFEST).read_bytes()
    assert re.search(rb',"crc32c":\d+\}$', raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gc.open(ck).step == 100


@pytest.mark.parametrize(
    "change",
    [
        (b'"step":100', b'"step":300'),  # the step changes silently without the seal
        (b'"tokens":12345', b'"tokens":12346'),
        (b'"step":100,', b""),  # the step dropped: read as None
    ],
)
def test_any_change_breaks_the_seal(ck: Path, change: tuple[bytes, bytes]) -> None:
    raw = (ck / MANIFEST).read_bytes()
    assert change[0] in raw
    (ck / MANIFEST).write_bytes(raw.replace(change[0], change[1]))
    with pytest.raises(gc.CheckpointError, match="manifest checksum does not match"):
        gc.load({"x": torch.zeros(6)}, ck)
    with pytest.raises(gc.CheckpointError, match="manifest checksum"):
        gc.verify(ck)
    assert gc.latest(ck.parent) is None


def test_every_single_bit_flip_is_caught(ck: Path) -> None:
    raw = (ck / MANIFEST).read_bytes()
    for i in range(len(raw)):
        for bit in (0, 3, 6):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            (ck / MANIFEST).write_bytes(bytes(bad))
            with pytest.raises(gc.CheckpointError):
                gc.open(ck)


def test_a_lost_seal_is_corruption_not_age(ck: Path) -> None:
    raw = (ck / MANIFEST).read_bytes()
    (ck / MANIFEST).write_bytes(re.sub(rb',"crc32c":\d+\}$', b"}", raw))
    with pytest.raises(gc.CheckpointError, match="lost its checksum"):
        gc.open(ck)


def test_duplicate_keys_are_refused(ck: Path) -> None:
    raw = (ck / MANIFEST).read_bytes()
    body = re.sub(rb',"crc32c":\d+\}$', b"}", raw)
    (ck / MANIFEST).write_bytes(body[:-1] + b',"step":300}')
    with pytest.raises(gc.CheckpointError, match="duplicate key 'step'"):
        gc.open(ck)


def test_an_old_unsealed_manifest_loads_with_a_warning() -> None:
    old = Path(__file__).parent / "data" / "v1-5fe0497"
    with pytest.warns(UnsealedManifestWarning, match="no checksum"):
        assert gc.open(old).step == 1234
