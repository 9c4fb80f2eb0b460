"""The numpy-only recipe in docs/FORMAT.md really reads a checkpoint (the spec is executable)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

import goodput.ckpt as gc

DOC = Path(__file__).resolve().parents[3] / "docs" / "FORMAT.md"


def test_format_md_recipe_reads_a_sharded_tensor(tmp_path: Path) -> None:
    w = torch.randn(10, 6)
    gc.save({"model": {"w": w}}, tmp_path)
    code = re.search(r"## Reading a tensor with numpy alone\s+```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    scope: dict = {"ck": str(tmp_path)}
    exec(compile(code, str(DOC), "exec"), scope)
    np.testing.assert_array_equal(scope["out"], w.numpy())
