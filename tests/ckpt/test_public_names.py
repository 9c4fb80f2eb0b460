"""The public map of goodput.ckpt: every name in ``__all__`` is what it says, however often used.

A lazy attribute that shares its name with a submodule is replaced by the module the moment that
submodule is imported (Python sets the package attribute), so ``goodput.ckpt.async_save(...)``
worked once per process and then raised ``TypeError: 'module' object is not callable``.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap

import goodput.ckpt


def test_no_public_name_is_also_a_submodule() -> None:
    submodules = {m.name for m in pkgutil.iter_modules(goodput.ckpt.__path__)}
    assert not submodules & set(goodput.ckpt.__all__)


def test_async_save_works_twice_in_one_process(tmp_path) -> None:
    code = textwrap.dedent(
        f"""
        import torch
        import goodput.ckpt as gc
        for step in (1, 2):
            h = gc.async_save({{"w": torch.full((4,), float(step))}}, {str(tmp_path)!r} + f"/step_{{step}}", step=step)
            h.result(timeout=120)
        import goodput.ckpt.async_saver  # importing every submodule changes nothing either
        assert callable(gc.async_save)
        print(gc.latest({str(tmp_path)!r}))
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("step_2")
