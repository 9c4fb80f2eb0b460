"""``goodput bench ...``: speed goals live here, as ratios against baselines measured in the same run."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)
