"""Entry point: ``goodput ckpt ...``, ``goodput bench ...``, ``goodput demo``."""

from __future__ import annotations

import typer

from . import bench, ckpt, plan, sched

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Keep training runs doing useful work.")
app.add_typer(ckpt.app, name="ckpt", help="Inspect, verify and convert checkpoints.")
app.add_typer(plan.app, name="plan", help="The arithmetic of failures, cadence, storage, memory and spot.")
app.add_typer(sched.app, name="sched", help="The checkpoint-aware scheduler and its simulator.")
app.add_typer(bench.app, name="bench", help="Measure against baselines run in the same process.")


@app.command()
def demo(
    workdir: str = typer.Option("", help="Where to write (default: a temporary directory, removed after)."),
    part: str = typer.Option(
        "all",
        help="all | train (kill and resume) | reshard (4 ranks to 3 and 1) | sched (the scheduler) "
        "| live (the live service preempts a real job and resumes it) "
        "| slurm (goodput drives a local Slurm cluster: a gang preempts two jobs).",
    ),
    mtbf: str = typer.Option("3.09h", help="Job MTBI for the recommended interval."),
    sched_live: bool = typer.Option(
        False,
        "--sched",
        help="Three torchrun jobs share 4 slots of the live service; a preemption, a resize, a service SIGKILL.",
    ),
) -> None:
    """Train with async checkpoints, kill a rank, resume on one, check every byte; then reshard."""
    if sched_live:
        from goodput.demo.sched_live import run_sched_live_demo

        raise typer.Exit(run_sched_live_demo(workdir or None))
    if part == "sched":
        from goodput.demo.sched import run_sched_demo

        raise typer.Exit(run_sched_demo(workdir or None))
    if part == "slurm":
        from goodput.demo.slurm import run_slurm_demo

        raise typer.Exit(run_slurm_demo(workdir or None))
    if part == "live":
        from goodput.demo.live import run_live_demo

        raise typer.Exit(run_live_demo(workdir or None))
    if part == "reshard":
        from goodput.demo.reshard import run_reshard_demo

        raise typer.Exit(run_reshard_demo(workdir or None))
    from goodput.demo.train import run_demo

    code = run_demo(workdir or None, "all" if part == "all" else "train", mtbf)
    if part == "all" and code == 0:
        from goodput.demo.sched import run_sched_demo

        code = run_sched_demo(None)
    if part == "all" and code == 0:
        from goodput.demo.live import run_live_demo

        code = run_live_demo(None)  # about 12 s on 2 cores
    raise typer.Exit(code)


if __name__ == "__main__":  # pragma: no cover
    app()
