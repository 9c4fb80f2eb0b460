"""The commit: rank 0 turns every rank's chunk records into the global metadata, then publishes
the manifest (the commit point).

:func:`commit_round` is rank 0's one decision once every rank has reported (its files and chunk
records, the checksums of the replicas it holds, or its error): a save gathers the reports with a
collective (:mod:`goodput.ckpt.saving.saver`), an asynchronous save through done files
(:mod:`goodput.ckpt.saving.background`); both then decide here, and word a failure the same way.
numpy only, so the background writer process can run it without importing torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from ..errors import CheckpointError, SaveError, describe, rank_errors
from ..format.format import (
    FORMAT_NAME,
    MANIFEST,
    FileEntry,
    Manifest,
    Metadata,
    MetadataRef,
    TensorEntry,
    check_file_name,
    encode_manifest,
    encode_metadata,
    metadata_file_name,
)
from ..format.geometry import Region
from ..storage.base import Storage
from ..storage.location import display
from .writer import FileResult


def file_records(results: list[FileResult]) -> list[list]:
    """This rank's files and chunk records, as sent to the committing rank."""
    return [
        [
            [r.name, r.bytes, r.crc_offset, r.crc_count],
            [[c.name, c.region.encode(), c.offset, c.length, c.crc32c, c.block0, c.blocks_crc32c] for c in r.records],
        ]
        for r in results
    ]


@dataclass
class Outcome:
    """Rank 0's verdict on a save: committed, or why not; and the files of older saves that the
    commit made garbage (removed after the other ranks are released)."""

    ok: bool
    error: str | None = None
    stale: list[str] = field(default_factory=list)  # names in the checkpoint directory


def commit_round(
    reports: list[dict], replica_keys: list[tuple[str, Region]] | None, write: Callable[[], list[str]]
) -> Outcome:
    """Commit (``write``: :func:`commit` with the save's arguments) if every rank wrote and (given
    ``replica_keys``) every replica group agrees.

    ``reports``: one per rank, ``{"rank", "error", "files"[, "crcs"]}``. Nothing is committed on
    any failure; the error names the ranks at fault."""
    errs = rank_errors(reports)
    if errs:
        return Outcome(False, f"failed while writing; nothing was committed. {errs}")
    if replica_keys:
        mismatch = replica_mismatch(replica_keys, reports)
        if mismatch:
            return Outcome(False, f"failed: {mismatch}")
    try:
        stale = write()
    except Exception as e:  # raised before the manifest's rename: nothing committed
        return Outcome(False, f"failed at commit on rank 0: {describe(e)}")
    return Outcome(True, None, stale)


def commit(
    storage: Storage,
    path: Path,
    save_id: str,
    step: int | None,
    world: int,
    meta: dict[str, tuple[str, list[int], str]],
    values: dict[str, Any],
    written: list[dict],
    block_bytes: int,
    user: dict[str, Any],
    staged: bool = False,
    replace: bool = True,
) -> list[str]:
    """Write the metadata and the manifest (the commit point); return files of older saves.

    ``staged``: a tiered save's first commit, on its fast tier. The manifest goes to the durable
    directory (``path``) under :func:`staged_name`, not as ``MANIFEST.json``: every rank copies it
    and the metadata into its own fast directory, and it becomes the durable manifest only once
    every rank's files have drained there (:mod:`goodput.ckpt.saving.tiers`).

    ``replace=False`` (a save that refuses to overwrite): the manifest is created only if none
    is there, even one committed by another save while this one was writing."""
    names = sorted(meta)
    tid = {n: i for i, n in enumerate(names)}
    tensors = [TensorEntry(n, meta[n][0], list(meta[n][1]), meta[n][2]) for n in names]
    files: list[FileEntry] = []
    rows: list[tuple] = []
    for rank, (fentry, records) in ((m["rank"], f) for m in written for f in m["files"]):
        fid = len(files)
        name, nbytes, crc_off, crc_count = fentry
        check_file_name(name, f"rank {rank}'s report")
        files.append(FileEntry(name, nbytes, crc_off, crc_count, rank))
        for tname, reg, off, length, crc, block0, table_crc in records:
            r = Region.decode(reg)
            rows.append((tid[tname], r.flat_start, tuple(r.offsets), fid, off, length, crc, block0, r, table_crc))
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    ndim = max([len(t.shape) for t in tensors], default=0)
    n = len(rows)
    cols = {
        "tensor": np.array([x[0] for x in rows], np.uint32),
        "file": np.array([x[3] for x in rows], np.uint32),
        "offset": np.array([x[4] for x in rows], np.int64),
        "length": np.array([x[5] for x in rows], np.int64),
        "crc32c": np.array([x[6] for x in rows], np.uint32),
        "block0": np.array([x[7] for x in rows], np.int64),
        "blocks_crc32c": np.array([x[9] for x in rows], np.uint32),
        "flat_start": np.array([x[8].flat_start for x in rows], np.int64),
        "flat_count": np.array([x[8].flat_count for x in rows], np.int64),
        "offsets": np.zeros((n, ndim), np.int64),
        "sizes": np.zeros((n, ndim), np.int64),
    }
    for i, x in enumerate(rows):
        r = x[8]
        if not r.is_flat and r.offsets:
            cols["offsets"][i, : len(r.offsets)] = r.offsets
            cols["sizes"][i, : len(r.sizes)] = r.sizes
    md = Metadata(save_id, block_bytes, tensors, files, values, cols, manifest_sealed=True)
    raw = encode_metadata(md)
    mname = metadata_file_name(save_id)
    storage.put(path, mname, raw)
    storage.sync(path)  # the data files' and metadata's names are durable before the commit
    manifest = Manifest(
        format=FORMAT_NAME,
        version=md.version,  # the metadata's: its values were encoded in it
        save_id=save_id,
        created=time.time(),
        world_size=world,
        metadata=MetadataRef(mname, len(raw), crc32c.crc32c(raw)),
        data_bytes=int(cols["length"].sum()) if n else 0,
        num_files=len(files),
        num_tensors=len(tensors),
        step=step,
        user=user,
    )
    raw_manifest = encode_manifest(manifest)
    if staged:
        storage.publish(path, staged_name(save_id), raw_manifest)
        return []
    replaced = previous_files(storage, path)
    if replace and storage.exists(path, MANIFEST):
        storage.publish(path, MANIFEST, raw_manifest)  # the commit point: replaces the checkpoint
    elif not storage.publish_new(path, MANIFEST, raw_manifest):  # the commit point of a first save
        storage.remove(path, mname)  # the ranks remove their data files when they hear of it
        raise SaveError(
            f"another save committed {display(path)!r} first (save {save_id} lost the race; its files are removed)"
        )
    return stale_files(storage, path, keep={mname, MANIFEST} | {f.name for f in files}, replaced=replaced)


LEFTOVER_AGE_S = 600.0


def staged_name(save_id: str) -> str:
    """A tiered save's manifest, committed on the fast tier and waiting for the drain."""
    return f".goodput-{save_id}.staged"


def previous_files(storage: Storage, path: Path) -> set[str]:
    """The files the manifest about to be replaced references (they go once the new one is in)."""
    from ..format.format import MAX_MANIFEST_BYTES, decode_manifest, decode_metadata

    try:
        raw = storage.get_if_exists(path, MANIFEST, "manifest", MAX_MANIFEST_BYTES)
        if raw is None:
            return set()
        old = decode_manifest(raw, str(path / MANIFEST))
        meta = storage.get(path, old.metadata.name, "metadata file", old.metadata.bytes)
        md = decode_metadata(meta, str(path), old)
    except (OSError, CheckpointError):
        return set()
    return {old.metadata.name} | {f.name for f in md.files}


def stale_files(storage: Storage, path: Path, keep: set[str], replaced: set[str]) -> list[str]:
    """Files to remove after a commit: those of the replaced checkpoint, and leftovers of saves
    that never committed once nobody has touched them for ten minutes. A save still running
    into the same directory touches its files, so they are never taken from under it."""
    now = time.time()
    out = []
    try:
        entries = storage.list(path)
    except OSError:
        return out
    for e in entries:
        if e.name in keep or not e.name.startswith(("data-", "metadata-", f".{MANIFEST}.tmp", ".goodput-")):
            continue
        if e.kind == "file" and (e.name in replaced or now - e.mtime > LEFTOVER_AGE_S):
            out.append(e.name)
    return out


def replica_mismatch(replica_keys: list[tuple[str, Region]], reports: list[dict]) -> str | None:
    """The first replica group whose holders reported different checksums, as an error message.

    ``reports``: one per rank, ``{"rank": r, "crcs": [[group index, crc], ...]}``. Vectorised:
    with DDP at 16k ranks every rank reports every tensor."""
    idx, crc, rank = [], [], []
    for m in reports:
        pairs = np.asarray(m["crcs"], np.int64).reshape(-1, 2)
        idx.append(pairs[:, 0])
        crc.append(pairs[:, 1])
        rank.append(np.full(len(pairs), m["rank"], np.int64))
    if not idx:
        return None
    g, c, r = np.concatenate(idx), np.concatenate(crc), np.concatenate(rank)
    if len(g) == 0:
        return None
    if g.min() < 0 or g.max() >= len(replica_keys):
        return "a rank reported a checksum for an unknown replica group"
    lo = np.full(len(replica_keys), np.iinfo(np.int64).max)
    hi = np.full(len(replica_keys), np.iinfo(np.int64).min)
    np.minimum.at(lo, g, c)
    np.maximum.at(hi, g, c)
    bad = np.flatnonzero((lo != hi) & (hi >= lo))
    if not len(bad):
        return None
    i = int(bad[0])
    name, region = replica_keys[i]
    sel = np.flatnonzero(g == i)
    groups: dict[int, list[int]] = {}
    for k in sel[np.argsort(r[sel], kind="stable")]:
        groups.setdefault(int(c[k]), []).append(int(r[k]))
    desc = " vs ".join(f"ranks {v}" for v in groups.values())
    return (
        f"replicas of {name!r} {region.describe()} differ across ranks ({desc}); "
        "a tensor without a declared layout must be identical on every rank (declare shards with "
        "DTensor, LocalShard or FlatShard)"
    )
