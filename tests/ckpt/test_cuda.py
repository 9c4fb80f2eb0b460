"""The CUDA paths: pinned staging on a side stream for saves (sync and async), cudaHostRegister of
the async staging segment, and CUDA load targets filled through the bounded pinned buffer.

They skip on machines without a GPU (CI has none); on a GPU machine run them with
``pytest tests/ckpt/test_cuda.py`` (a CUDA build of torch 2.13 is needed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run tests/ckpt/test_cuda.py on a GPU machine)"
)


def _state(device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(512, 256, generator=g).to(device),
        "b": torch.randn(1000, generator=g).to(torch.bfloat16).to(device),
        "i": torch.arange(77, dtype=torch.int64).to(device),
        "step": 3,
    }


def _blank(state: dict) -> dict:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}


def test_cuda_state_saves_and_loads_bitwise(tmp_path: Path) -> None:
    src = _state("cuda")
    gc.save(src, tmp_path / "c")
    dst = _blank(src)
    gc.load(dst, tmp_path / "c", staging_bytes=64 << 10)  # many rounds through the pinned buffer
    for k in ("w", "b", "i"):
        assert dst[k].device.type == "cuda"
        assert torch.equal(dst[k].cpu(), src[k].cpu()), k
    assert dst["step"] == 3
    np.testing.assert_array_equal(gc.open(tmp_path / "c").read("w"), src["w"].cpu().numpy())
    gc.verify(tmp_path / "c")


def test_cpu_saved_state_loads_into_cuda_views_and_shards(tmp_path: Path) -> None:
    full = torch.randn(300, 200)
    gc.save({"w": full, "v": full.clone()}, tmp_path / "c")
    transposed = torch.zeros(200, 300, device="cuda").t()  # no contiguous view: staged piece by piece
    part = gc.LocalShard(torch.zeros(100, 50, device="cuda"), (300, 200), (100, 50))
    gc.load({"w": transposed, "v": part}, tmp_path / "c", staging_bytes=8192)
    assert torch.equal(transposed.cpu(), full)
    assert torch.equal(part.tensor.cpu(), full[100:200, 50:100])


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_async_save_of_cuda_state_goes_through_registered_staging(tmp_path: Path, mode: str) -> None:
    from goodput.ckpt.saving.async_saver import AsyncSaver

    src = _state("cuda")
    before = src["w"].clone()
    saver = AsyncSaver(mode=mode)
    try:
        handle = saver.save(src, tmp_path / "a")
        src["w"].add_(1.0)  # training goes on as soon as save() returns: the checkpoint keeps `before`
        handle.result()
        assert saver.pool.pinned, "cudaHostRegister of the staging segment failed"
    finally:
        saver.close()
    np.testing.assert_array_equal(gc.open(tmp_path / "a").read("w"), before.cpu().numpy())
    dst = _blank(src)
    gc.load(dst, tmp_path / "a")
    assert torch.equal(dst["w"], before) and torch.equal(dst["b"], src["b"])
