"""The errors of goodput.ckpt, and how errors from several ranks become one message.

Every failure a user sees is one of two types: :class:`CheckpointError` (a checkpoint is missing,
corrupt, foreign or malformed, or cannot be read into what was given) and its subclass
:class:`SaveError` (a save failed and committed nothing). Collectives carry errors as data, so a
failure on one rank makes every rank raise the same message, naming the rank at fault; the
functions here are the one way those messages are joined, for the collective save and for the
file-based commit of an asynchronous one alike. numpy-free and torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class CheckpointError(Exception):
    """A checkpoint is missing, corrupt, foreign or malformed. The message names what is wrong."""


class SaveError(CheckpointError):
    """A save failed; nothing was committed. The message names the rank, key or file at fault."""


def describe(e: BaseException) -> str:
    """An exception as one line of a message carried to other ranks."""
    return f"{type(e).__name__}: {e}"


def rank_errors(reports: Iterable[dict[str, Any]]) -> str | None:
    """``"rank 1: ...; rank 3: ..."`` from per-rank reports (``{"rank": r, "error": str | None}``),
    or None when no rank failed."""
    errs = [f"rank {m['rank']}: {m['error']}" for m in reports if m.get("error")]
    return "; ".join(errs) if errs else None


def raise_rank_errors(reports: Iterable[dict[str, Any]], what: str) -> None:
    """Raise :class:`SaveError` ``"<what>; nothing was committed. rank r: ..."`` if any rank failed."""
    errs = rank_errors(reports)
    if errs:
        raise SaveError(f"{what}; nothing was committed. {errs}")
