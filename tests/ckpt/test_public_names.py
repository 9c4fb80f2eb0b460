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
        import goodput.ckpt.saving.async_saver  # importing every submodule changes nothing either
        assert callable(gc.async_save)
        print(gc.latest({str(tmp_path)!r}))
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("step_2")


def test_dcps_public_names_resolve_on_goodput_ckpt() -> None:
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict_saver as dcp_saver

    for name in ("DefaultSavePlanner", "DefaultLoadPlanner", "CheckpointException"):
        assert getattr(goodput.ckpt, name) is getattr(dcp, name)
    assert goodput.ckpt.AsyncCheckpointerType is dcp_saver.AsyncCheckpointerType
    assert goodput.ckpt.AsyncSaveResponse is dcp_saver.AsyncSaveResponse
    import goodput.ckpt.filesystem as fs
    import goodput.ckpt.state_dict_loader as loader
    import goodput.ckpt.state_dict_saver as saver

    assert saver.save is goodput.ckpt.save and saver.async_save is goodput.ckpt.async_save
    assert saver.save_state_dict is goodput.ckpt.save_state_dict
    assert saver.AsyncCheckpointerType is dcp_saver.AsyncCheckpointerType
    assert loader.load is goodput.ckpt.load and loader.load_state_dict is goodput.ckpt.load_state_dict
    assert fs.FileSystemWriter is goodput.ckpt.FileSystemWriter and fs.FileSystemReader is goodput.ckpt.FileSystemReader
    assert goodput.ckpt.state_dict_saver is saver  # reached as an attribute, as DCP's submodules are


def test_dir_and_all_list_the_api() -> None:
    for name in ("save", "load", "async_save", "export", "Checkpointer", "CheckpointException", "DefaultSavePlanner"):
        assert name in goodput.ckpt.__all__ and name in dir(goodput.ckpt)
    for name in goodput.ckpt.__all__:
        assert getattr(goodput.ckpt, name) is not None


def test_errors_subclass_dcps_exception_without_importing_torch() -> None:
    """The numpy-only reader never imports torch for it; once DCP is imported, goodput's errors
    are DCP's CheckpointException, whichever was imported first."""
    code = textwrap.dedent(
        """
        import sys
        import goodput.ckpt as gc
        try:
            gc.open("/nonexistent/x")
        except gc.CheckpointError:
            pass
        assert "torch" not in sys.modules
        import torch.distributed.checkpoint as dcp
        try:
            gc.open("/nonexistent/x")
        except dcp.CheckpointException as e:
            print("caught", type(e).__name__)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "caught CheckpointError"


def test_module_paths_the_docs_give_stay_the_real_objects() -> None:
    """README.md and docs/ name ``goodput.ckpt.s3``, ``.staging``, ``.storage``, ``.errors`` and
    ``.dcp_compat``: after the package was split into folders they still hold the same objects."""
    import goodput.ckpt.dcp_compat as dcp_compat
    import goodput.ckpt.errors as errors
    import goodput.ckpt.s3 as s3
    import goodput.ckpt.staging as staging
    import goodput.ckpt.storage as storage
    from goodput.ckpt.saving import staging as real_staging
    from goodput.ckpt.storage import location
    from goodput.ckpt.storage import s3 as real_s3

    assert s3.configure is real_s3.configure and s3.default_storage is real_s3.default_storage
    assert staging.CopyFirst is real_staging.CopyFirst and staging.StaleStateError is real_staging.StaleStateError
    assert storage.S3Location is location.S3Location and storage.storage_for is location.storage_for
    assert storage.storage_for("s3://bucket/key") is real_s3.default_storage()
    assert dcp_compat.FileSystemWriter is goodput.ckpt.FileSystemWriter
    assert errors.CheckpointError is goodput.ckpt.CheckpointError and issubclass(errors.StorageError, OSError)


def test_damaged_checkpoint_names_are_public_without_torch() -> None:
    """``latest()`` warns with DamagedCheckpointWarning and ``scan_checkpoints`` lists what it
    skipped: a user filters or escalates the one and calls the other from ``goodput.ckpt``, on
    the numpy-only reader (no torch import)."""
    code = textwrap.dedent(
        """
        import sys
        import goodput.ckpt as gc
        from goodput.ckpt import DamagedCheckpointWarning, scan_checkpoints
        from goodput.ckpt.loading import reader
        assert scan_checkpoints is reader.scan_checkpoints
        assert DamagedCheckpointWarning is reader.DamagedCheckpointWarning
        for name in ("scan_checkpoints", "DamagedCheckpointWarning"):
            assert name in gc.__all__ and name in dir(gc), name
        assert "torch" not in sys.modules
        print("ok")
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "ok"
