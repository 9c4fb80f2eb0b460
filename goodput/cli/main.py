"""Entry point: ``goodput ckpt ...``, ``goodput bench ...``, ``goodput demo``."""

from __future__ import annotations

import typer

from . import bench, ckpt, plan

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Keep training runs doing useful work.")
app.add_typer(ckpt.app, name="ckpt", help="Inspect, verify and convert checkpoints.")
app.add_typer(plan.app, name="plan", help="The arithmetic of failures, cadence, storage, memory and spot.")
app.add_typer(bench.app, name="bench", help="Measure against baselines run in the same process.")


@app.command()
def demo(
    workdir: str = typer.Option("", help="Where to write (default: a temporary directory)."),
) -> None:
    """Save a real multi-rank checkpoint, reshard it, load it, and check every byte."""
    from goodput.demo import run_demo

    raise typer.Exit(run_demo(workdir or None))


if __name__ == "__main__":  # pragma: no cover
    app()
