"""``goodput ckpt ls | inspect | verify | import-dcp | export``."""

from __future__ import annotations

import json
import sys
import time
import unicodedata
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from goodput.ckpt.format.format import CheckpointError, value_repr
from goodput.ckpt.loading.reader import Checkpoint, scan_checkpoints
from goodput.ckpt.storage.location import as_location, display, storage_for
from goodput.plan.units import UnitError, fmt_bytes, parse_size

app = typer.Typer(no_args_is_help=True)
# piped or redirected, tables are as wide as their content: a name is never cut to "app.model.la…"
console = Console() if sys.stdout.isatty() else Console(width=1 << 16)
err = Console(stderr=True)


@app.callback()
def options(
    endpoint: str | None = typer.Option(
        None, "--endpoint", help="S3 endpoint URL for s3:// locations (default: AWS_ENDPOINT_URL, AWS config)."
    ),
    region: str | None = typer.Option(None, "--region", help="S3 region (default: AWS_REGION, AWS config)."),
) -> None:
    """Checkpoint locations are directories or s3://bucket/prefix (credentials: the AWS chain)."""
    if endpoint or region:
        from goodput.ckpt.storage import s3

        s3.configure(endpoint_url=endpoint, region=region)


def _fail(e: Exception) -> None:
    err.print(f"[red]error:[/red] {shown(str(e))}")
    raise typer.Exit(1)


def shown(text: str) -> str:
    """Text from a checkpoint or its storage (tensor and directory names, values, errors that
    quote them) as Rich prints it literally: markup escaped, control characters written as
    escapes, so that a name can neither style the output nor split a table row."""
    if any(unicodedata.category(c)[0] == "C" for c in text):
        text = "".join(
            c.encode("unicode_escape").decode("ascii") if unicodedata.category(c)[0] == "C" else c for c in text
        )
    return escape(text)


def _location(text: str) -> Path:
    """A command's location argument: a path, or s3://bucket/prefix (typer's Path would fold
    ``s3://`` into ``s3:``, a local name)."""
    try:
        storage_for(text)
        if text.startswith("s3:/"):
            from goodput.ckpt.storage.s3 import split

            split(text)
        loc = as_location(text)
    except ValueError as e:
        err.print(f"[red]error:[/red] {shown(str(e))}")
        raise typer.Exit(2) from None
    return loc


@app.command("ls")
def ls(
    root_arg: str = typer.Argument(..., metavar="ROOT", help="Directory or s3://bucket/prefix holding checkpoints."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Committed checkpoints under ROOT: step, size, files, commit time; and directories whose
    manifest is there but cannot be read (damaged, or written by a newer goodput), with why.

    --json: one row per directory; a damaged one has "damaged": why, and null elsewhere."""
    root = _location(root_arg)
    try:
        storage_for(root).list(root)
    except (FileNotFoundError, NotADirectoryError) as e:
        what = "does not exist" if isinstance(e, FileNotFoundError) else "is not a directory"
        err.print(f"[red]error:[/red] checkpoint root {shown(repr(display(root)))} {what}")
        raise typer.Exit(2) from None
    except (OSError, ValueError) as e:
        err.print(
            f"[red]error:[/red] cannot read checkpoint root {shown(repr(display(root)))}: "
            f"{shown(str(getattr(e, 'strerror', None) or e))}"
        )
        raise typer.Exit(2) from None
    try:
        listing = scan_checkpoints(root)
    except CheckpointError as e:  # the storage failed while listing: never "no checkpoint"
        err.print(f"[red]error:[/red] {shown(str(e))}")
        raise typer.Exit(2) from None
    found = listing.committed
    rows = [
        {
            "path": display(p),
            "step": m.step,
            "bytes": m.data_bytes,
            "tensors": m.num_tensors,
            "files": m.num_files,
            "world_size": m.world_size,
            "created": m.created,
            "damaged": None,
        }
        for p, m in found
    ]
    keys = ("step", "bytes", "tensors", "files", "world_size", "created")
    bad = [{"path": display(d.path), **dict.fromkeys(keys), "damaged": d.reason} for d in listing.damaged]
    if as_json:
        print(json.dumps(rows + bad, indent=2))
        return
    _print_damaged(root, listing.damaged)
    if not rows:
        console.print(f"no committed checkpoint in {shown(display(root))}")
        return
    t = Table(title=f"committed checkpoints in {shown(display(root))}")
    t.add_column("checkpoint", overflow="fold")
    for c in ("step", "size", "tensors", "files", "ranks", "committed"):
        t.add_column(c)
    for (p, _), r in zip(found, rows):
        t.add_row(
            shown(_rel(p, root)), str(r["step"]), fmt_bytes(r["bytes"]), str(r["tensors"]), str(r["files"]), str(r["world_size"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"])),
        )  # fmt: skip
    console.print(t)


def _rel(p: Path, root: Path) -> str:
    return p.name if p != root else "."


def _print_damaged(root: Path, damaged: list) -> None:
    if not damaged:
        return
    t = Table(title=f"[red]damaged or unreadable[/red] in {shown(display(root))} (never deleted by a Checkpointer)")
    t.add_column("directory", overflow="fold")
    t.add_column("why its MANIFEST.json cannot be read", overflow="fold")
    for d in damaged:
        t.add_row(shown(_rel(d.path, root)), shown(d.reason))
    console.print(t)


@app.command()
def inspect(
    path_arg: str = typer.Argument(..., metavar="PATH", help="Checkpoint directory or s3://bucket/prefix."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Tensors, global shapes, dtypes, layouts and bytes per rank of the checkpoint at PATH."""
    path = _location(path_arg)
    try:
        ck = Checkpoint(path)
    except CheckpointError as e:
        _fail(e)
    tensors = []
    for t in ck.tensors.values():
        tensors.append(
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "kind": t.kind,
                "bytes": t.nbytes,
                "chunks": [
                    {
                        "region": c.region.describe(),
                        "rank": c.rank,
                        "file": c.file,
                        "offset": c.offset,
                        "length": c.length,
                        "crc32c": c.crc32c,
                    }
                    for c in t.chunks
                ],
            }
        )
    out = {
        "path": display(path),
        "step": ck.step,
        "save_id": ck.manifest.save_id,
        "world_size": ck.manifest.world_size,
        "data_bytes": ck.manifest.data_bytes,
        "block_bytes": ck.metadata.block_bytes,
        "bytes_per_rank": {str(k): v for k, v in sorted(ck.bytes_per_rank().items())},
        "tensors": tensors,
        "values": ck.values,
    }
    if as_json:
        print(json.dumps(out, indent=2, default=str))
        return
    console.print(
        f"[bold]{shown(display(path))}[/bold]  step={ck.step}  save={shown(ck.manifest.save_id)}  ranks={ck.manifest.world_size}  data={fmt_bytes(ck.manifest.data_bytes)}"
    )
    t = Table()
    for c in ("tensor", "dtype", "shape", "size", "chunks", "layout"):
        t.add_column(c, overflow="fold")  # wrapped on a narrow terminal, never cut
    for x in tensors:
        layout = ", ".join(f"r{c['rank']}{c['region']}" for c in x["chunks"][:4])
        if len(x["chunks"]) > 4:
            layout += f", … (+{len(x['chunks']) - 4})"
        t.add_row(
            shown(x["name"]),
            shown(x["dtype"]),
            str(tuple(x["shape"])),
            fmt_bytes(x["bytes"]),
            str(len(x["chunks"])),
            shown(layout),
        )
    console.print(t)
    r = Table(title="bytes written per rank")
    r.add_column("rank")
    r.add_column("bytes")
    for k, v in out["bytes_per_rank"].items():
        r.add_row(k, fmt_bytes(v))
    console.print(r)
    if ck.values:
        console.print("values: " + shown(", ".join(f"{k}={value_repr(v)}" for k, v in list(ck.values.items())[:20])))


@app.command()
def verify(
    path_arg: str = typer.Argument(..., metavar="PATH", help="Checkpoint directory or s3://bucket/prefix."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Check every chunk and block checksum, file sizes, and that chunks tile each tensor.

    --json prints {"ok", "path", "bytes", "chunks", "tensors", "sealed"} or {"ok": false,
    "path", "error"}; the exit status is 0 or 1 either way."""
    path = _location(path_arg)
    try:
        ck = Checkpoint(path)
        total = int(ck.metadata.cols["length"].sum())
        with Progress(
            TextColumn("verify"), BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeRemainingColumn(),
            console=err, transient=not sys.stderr.isatty(), disable=as_json,
        ) as prog:  # fmt: skip
            task = prog.add_task("verify", total=total)
            checked = ck.verify(progress=lambda n: prog.advance(task, n))
    except CheckpointError as e:
        if as_json:
            print(json.dumps({"ok": False, "path": display(path), "error": str(e)}))
            raise typer.Exit(1) from None
        _fail(e)
    if as_json:
        print(
            json.dumps(
                {
                    "ok": True,
                    "path": display(path),
                    "bytes": checked,
                    "chunks": ck.metadata.num_chunks,
                    "tensors": len(ck.metadata.tensors),
                    "sealed": ck.sealed,
                }
            )
        )
        return
    seal = "manifest sealed" if ck.sealed else "[yellow]manifest has no checksum (written by an older goodput)[/yellow]"
    console.print(
        f"[green]ok[/green]: {shown(display(path))} ({fmt_bytes(checked)} in {ck.metadata.num_chunks} chunks, {len(ck.metadata.tensors)} tensors; {seal})"
    )


def _parse_bytes(text: str) -> int:
    """The project's one size parser: 1GB is 10^9 bytes, 1GiB 2^30."""
    try:
        return parse_size(text)
    except UnitError as e:
        raise typer.BadParameter(str(e)) from None


@app.command("import-dcp")
def import_dcp_cmd(
    dcp_dir: Path = typer.Argument(..., help="Directory written by torch.distributed.checkpoint (holds .metadata)."),
    dest: Path = typer.Argument(
        ..., help="Directory or s3://bucket/prefix for the goodput checkpoint (absent or empty)."
    ),
    max_batch_bytes: str = typer.Option(
        "1GiB",
        "--max-batch-bytes",
        help="Tensor bytes read per DCP load; all of them stay in memory only if the whole checkpoint fits.",
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Allow a non-empty DEST: a goodput checkpoint there is replaced atomically; other files are left alone.",
    ),
    allow_skipped: bool = typer.Option(
        False,
        "--allow-skipped",
        help="Import even if some entries cannot be converted (they are listed); without it that fails, writing nothing.",
    ),
) -> None:
    """Convert a DCP checkpoint into a goodput checkpoint (same tensor names, dtypes and bytes).

    DCP's metadata is a pickle: import only checkpoints you trust.
    """
    import warnings

    budget = _parse_bytes(max_batch_bytes)
    prog = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeRemainingColumn(),
        console=err, transient=not sys.stderr.isatty(),
    )  # fmt: skip
    task = None

    def progress(event: str, n: int) -> None:
        nonlocal task
        if event == "total":  # the source checked out: only now show a bar
            prog.start()
            task = prog.add_task("load", total=n)
        elif task is not None and event == "load":
            prog.advance(task, n)
        elif task is not None and event == "write":
            prog.update(task, description="write")

    try:
        from goodput.ckpt.compat.dcp_import import DCPImportWarning, import_dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DCPImportWarning)  # reported below, once
            res = import_dcp(
                dcp_dir,
                dest,
                max_batch_bytes=budget,
                progress=progress,
                overwrite=overwrite,
                allow_skipped=allow_skipped,
            )
    except (CheckpointError, OSError) as e:
        prog.stop()
        _fail(e)
    finally:
        prog.stop()
    for k, why in res.skipped.items():
        err.print(f"[yellow]skipped[/yellow] {shown(k)}: {shown(str(why))}")
    how = "through a scratch file" if res.spilled else "in memory"
    console.print(
        f"[green]ok[/green]: {shown(display(res.path))} ({res.tensors} tensors, {fmt_bytes(res.bytes)}, {res.values} values, "
        f"{len(res.skipped)} skipped; {res.batches} batches {how}; {res.seconds:.1f}s)"
    )


@app.command("export")
def export_cmd(
    src: str = typer.Argument(..., help="goodput checkpoint (directory or s3://bucket/prefix)."),
    dst: str = typer.Argument(
        ..., help="Directory or s3:// prefix (safetensors), or the file to write (torch); must not exist yet."
    ),
    fmt: str = typer.Option("safetensors", "--format", help="safetensors (Hugging Face's layout) or torch."),
    prefix: str | None = typer.Option(
        None, "--prefix", help="Only tensors whose names start with this, written without it (e.g. model.)."
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="Cast floating tensors (not 0-d ones: an optimizer's step): bf16, fp16 or fp32."
    ),
    max_shard_size: str = typer.Option(
        "5GB", "--max-shard-size", help="Largest shard (one shard is in memory at a time); --format torch: the limit."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Allow a non-empty DST (files are replaced by name)."),
) -> None:
    """Write full (consolidated) tensors of a checkpoint saved in any layout, for Hugging Face or torch.load.

    safetensors: model.safetensors, or model-0000i-of-0000N.safetensors and
    model.safetensors.index.json (weight_map), readable by safetensors.torch.load_file.
    """
    limit = _parse_bytes(max_shard_size)
    prog = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeRemainingColumn(),
        console=err, transient=not sys.stderr.isatty(),
    )  # fmt: skip
    task = None

    def progress(event: str, n: int) -> None:
        nonlocal task
        if event == "total":
            prog.start()
            task = prog.add_task("export", total=n)
        elif task is not None and event == "read":
            prog.advance(task, n)
        elif task is not None and event == "shard":
            prog.update(task, description=f"export ({n} files written)")

    try:
        from goodput.ckpt.compat.exporter import export

        res = export(
            src,
            dst,
            format=fmt,
            prefix=prefix,
            dtype=dtype,
            max_shard_size=limit,
            overwrite=overwrite,
            progress=progress,
        )
    except (CheckpointError, OSError, ValueError) as e:
        prog.stop()
        _fail(e)
    finally:
        prog.stop()
    for k, why in res.skipped.items():
        err.print(f"[yellow]not exported[/yellow] {shown(k)}: {shown(str(why))}")
    for key in res.aborted:
        err.print(f"aborted the incomplete upload a killed export left: {shown(key)}")
    console.print(
        f"[green]ok[/green]: {shown(str(res.path))} ({res.tensors} tensors, {fmt_bytes(res.bytes)} in {len(res.files)} files: "
        f"{shown(', '.join(res.files[:3]))}{', ...' if len(res.files) > 3 else ''}; "
        + (f"{len(res.carried)} values beside them in goodput_values.json; " if res.carried else "")
        + f"{len(res.skipped)} not exported; {res.seconds:.1f}s)"
    )
