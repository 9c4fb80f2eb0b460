"""Which scheduler modules run compiled, and whether each extension still matches its source.

``setup.py`` compiles :data:`MODULES` with mypyc when it can and records the SHA-256 of each source
it compiled in ``native.json`` beside this file. Python imports an extension in preference to the
``.py`` of the same name, so a source edited after the build would silently not be what runs:
:func:`status` finds that, and importing :mod:`goodput.sched` warns about it. Only the standard
library here: ``setup.py`` reads :data:`MODULES` from this file before anything is installed.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

# the hot path of every scheduling pass and of the simulator, leaves first, named below goodput.sched
# (core/transitions.py is not here: mypyc cannot compile its RuntimeError subclass, and it is not hot)
MODULES: tuple[str, ...] = (
    "core.model",
    "core.queue",
    "core.capacity",
    "core.eviction",
    "core.placement",
    "core.policy",
    "core.executor",
    "core.events",
    "sim.ledger",
    "core.state",
    "core.claims",
    "core.reservations",
    "core.preemption",
    "core.scheduler",
    "sim.simulator",
)
HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "native.json"


@dataclass(frozen=True)
class NativeStatus:
    compiled: tuple[str, ...]  # modules whose import finds an extension
    pure: tuple[str, ...]  # modules that run as Python source
    stale: tuple[str, ...]  # extensions built from a source that has changed since

    @property
    def label(self) -> str:
        if self.stale:
            return f"compiled, STALE: {', '.join(self.stale)} changed since the build"
        if not self.compiled:
            return "pure Python"
        if self.pure:
            return f"mixed: {', '.join(self.pure)} pure Python"
        return "compiled (mypyc)"


def source_of(name: str) -> str:
    """``core.model`` -> ``core/model.py``: the source of a listed module, below this package."""
    return name.replace(".", "/") + ".py"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def status() -> NativeStatus:
    """Read without importing the modules: which would load from an extension, and how fresh."""
    try:
        built = json.loads(MANIFEST.read_text()).get("sources", {})
    except (OSError, ValueError, AttributeError):
        built = {}
    compiled, pure, stale = [], [], []
    for name in MODULES:
        spec = importlib.util.find_spec(f"goodput.sched.{name}")
        native = spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
        (compiled if native else pure).append(name)
        rel = source_of(name)
        src = HERE / rel
        if native and (built.get(f"goodput/sched/{rel}") != (_digest(src) if src.exists() else None)):
            stale.append(name)
    return NativeStatus(tuple(compiled), tuple(pure), tuple(stale))
