"""Job ids and tenant names: one character set for every way in (a workload CSV, the live
service's names and ids, a caller of :class:`~goodput.sched.core.scheduler.Scheduler`), what a
log, a URL path and a shell carry without quoting. A space around an id (" a " beside "a") made
two jobs that read as one; a leading "-" reads as a flag."""

from __future__ import annotations

import re

ID_CHARS = "A-Za-z0-9._:@-"
ID_MAX = 128
ID_RE = re.compile(rf"[A-Za-z0-9][{ID_CHARS}]{{0,{ID_MAX - 1}}}")
ID_RULE = f"1-{ID_MAX} of [{ID_CHARS}], starting with a letter or digit"


def check_id(s: str) -> str:
    """``s`` if it is a valid job id or tenant name (:data:`ID_RULE`), else a ValueError saying why."""
    if not isinstance(s, str) or not s:
        raise ValueError(f"expected an id ({ID_RULE}), got {s!r}")
    if s != s.strip():
        raise ValueError(f"{s!r} has surrounding spaces (ids are {ID_RULE})")
    if ID_RE.fullmatch(s) is None:
        bad = sorted({c for c in s if not re.fullmatch(f"[{ID_CHARS}]", c)})
        why = f"characters {''.join(bad)!r} are not allowed" if bad else "wrong length or first character"
        raise ValueError(f"{s!r}: {why} (ids are {ID_RULE})")
    return s
