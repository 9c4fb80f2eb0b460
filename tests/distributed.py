"""Tests run ranks through the package's own launcher (real processes, real gloo)."""

from goodput.demo.localdist import RankFailure, run_ranks

__all__ = ["RankFailure", "run_ranks"]
