"""The storage seam: checkpoint I/O goes through goodput.ckpt.storage, and what it refuses."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.storage.local import POSIX
from goodput.ckpt.storage.location import storage_for

PKG = Path(gc.__file__).parent
# modules whose own I/O is not checkpoint storage: the seam itself, the shared-memory staging
# buffer, the writer process's pipe, the note a rank's watcher leaves its writer (a local
# temporary file between two of the rank's own threads or processes, never in the checkpoint), and the readers and writers of foreign formats: DCP's importer,
# Hugging Face directories (read where they lie, local only) and the safetensors export (the
# safetensors library writes a local file, which the exporter commits by replace or uploads), and the
# export's lock on its destination (flock on the local directory: a lock, not a file of the export)
NOT_STORAGE = {
    "storage/local.py",
    "saving/staging.py",
    "saving/writer_process.py",
    "saving/peers.py",
    "compat/dcp_import.py",
    "loading/hf.py",
    "compat/exporter.py",
    "compat/destination.py",
}
OS_OPS = {
    "open",
    "replace",
    "rename",
    "unlink",
    "listdir",
    "scandir",
    "makedirs",
    "remove",
    "fsync",
    "preadv",
    "rmtree",
}
PATH_OPS = {
    "iterdir",
    "read_bytes",
    "write_bytes",
    "read_text",
    "write_text",
    "mkdir",
    "touch",
    "glob",
    "unlink",
    "is_dir",
}


def _file_calls(path: Path) -> list[str]:
    """Calls of os/shutil file operations, and of pathlib's, on anything but a Storage."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner, name = node.func.value, node.func.attr
        owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        if (owner_name in ("os", "shutil") and name in OS_OPS) or (
            name in PATH_OPS and owner_name not in ("storage", "os", "np")
        ):
            found.append(f"{path.name}:{node.lineno}: {owner_name}.{name}()")
    return found


def test_checkpoint_io_goes_through_the_seam() -> None:
    """Save, load, the async writer, commit, retention and the reader name no file operation
    of their own: a new kind of storage is an implementation of Storage, not a rewrite."""
    offenders = [
        c for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).as_posix() not in NOT_STORAGE for c in _file_calls(p)
    ]
    offenders += _file_calls(PKG.parent / "cli" / "ckpt.py")
    assert offenders == []


def test_unknown_scheme_is_refused_not_made_a_directory(tmp_path: Path) -> None:
    os.chdir(tmp_path)
    with pytest.raises(ValueError, match="'abc://'.*not supported"):
        gc.save({"x": torch.zeros(2)}, checkpoint_id="abc://bucket/ck")
    with pytest.raises(ValueError, match="not supported"):
        gc.load({"x": torch.zeros(2)}, checkpoint_id="abc://bucket/ck")
    assert list(tmp_path.iterdir()) == []
    assert storage_for(tmp_path / "plain") is POSIX


def test_listing_never_follows_links(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "l").symlink_to(tmp_path / "d")
    os.mkfifo(tmp_path / "p")
    kinds = {e.name: e.kind for e in POSIX.list(tmp_path)}
    assert kinds == {"d": "dir", "f": "file", "l": "link", "p": "other"}


def _committed(root: Path, step: int) -> Path:
    path = root / f"step_{step:09d}"
    gc.save({"x": torch.full((4,), float(step))}, path, step=step)
    return path


def test_latest_pointer_rules(tmp_path: Path) -> None:
    """The pointer and the step directories get the rules of files inside a checkpoint: no
    links, regular files only, bounded reads; any problem falls back to listing, never a hang."""
    root = tmp_path / "run"
    root.mkdir()
    s1 = _committed(root, 1)
    other = _committed(tmp_path / "other-run", 9)
    (root / "step_000000009").symlink_to(other)  # another run's checkpoint behind a link
    for pointer in (b"\xff\xfe\xfa", b"step_000000009", b"step_000000001" * 1000, b"step_000000001"):
        (root / "latest").write_bytes(pointer)
        assert gc.latest(root) == s1
    (root / "latest").unlink()
    os.mkfifo(root / "latest")  # a read would block forever
    assert gc.latest(root) == s1
    (root / "latest").unlink()
    (root / "latest").symlink_to("/etc/passwd")
    assert gc.latest(root) == s1
    assert [p for p, _ in gc.list_checkpoints(root)] == [s1]
