"""goodput.sched: a checkpoint-aware GPU cluster scheduler, its simulator and its live service.

Its hot modules may run compiled (see :mod:`goodput.sched.native`); an extension older than its
source is reported here, at import, because what runs would not be what the source says.
"""

from __future__ import annotations

import warnings

from . import native as _native

_status = _native.status()
if _status.stale:
    warnings.warn(
        f"goodput.sched: the compiled {', '.join(_status.stale)} no longer match their sources; "
        "the extensions, not the edited .py files, are what runs. Rebuild with `make venv` "
        "(or `pip install -e .`), or remove the .so files to run the sources.",
        RuntimeWarning,
        stacklevel=2,
    )
