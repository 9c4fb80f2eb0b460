"""The scheduler's web dashboard (docs/DASHBOARD.md): served by the live service at ``/ui``, and
written as one self-contained page from an event log (``goodput sched report --html``, ``sim --ui``).

``router(svc, person)`` is what the service includes; ``write_report`` writes the static page.
"""

from __future__ import annotations

from .page import write_report
from .routes import router

__all__ = ["router", "write_report"]
