"""The dashboard's HTML: the live page (files served by the service) and the static report (one file).

Both are the same template and the same script; the static report inlines the script, the chart
library and the data, so it opens from disk in a browser with no network and no server.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.events import iter_jsonl

WALL_CLOCK_AFTER = 1e9  # seconds: a log whose first record is later than 2001 is on the wall clock
STATIC_FILES = ("app.js", "app.css", "chart.umd.min.js", "chart.js.LICENSE.md")
SECURITY_HEADERS = {
    # the page's own files only: no CDN, no inline script, no inline style (the script sets styles
    # through the CSSOM, as Chart.js does, which a policy does not restrict); never framed
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# the JSON the page reads and the page's files (errors included): never sniffed as HTML, never run as a
# document, never framed, never kept by a cache (the JSON is one viewer's cut)
DATA_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def static_file(name: str) -> bytes | None:
    """One of the dashboard's shipped files by its bare name (nothing else: no path is ever joined);
    read once, not on every request (they are served without a token)."""
    return _shipped(name) if name in STATIC_FILES else None


@functools.cache  # keyed by the few shipped names only (an unknown name never reaches it)
def _shipped(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _template() -> str:
    return resources.files(__package__).joinpath("static", "index.html").read_text(encoding="utf-8")


def live_html() -> str:
    head = (
        '<link rel="stylesheet" href="/ui/static/app.css">\n'
        '<script src="/ui/static/chart.umd.min.js" defer></script>\n'
        '<script src="/ui/static/app.js" defer></script>'
    )
    return _template().replace("<!--HEAD-->", head).replace("<!--DATA-->", "").replace("<!--TITLE-->", "goodput")


def _clean(x: Any) -> Any:
    """JSON has no infinity: non-finite numbers become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(_clean(data), separators=(",", ":"), allow_nan=False)


def static_html(data: dict[str, Any]) -> str:
    """One self-contained page: the script, the chart library and ``data`` inlined.

    It carries its own Content-Security-Policy (a ``<meta>``, the page opens from disk): only its own
    two scripts and its stylesheet, by their SHA-256, run or apply, and nothing is fetched; should a
    value of the log ever reach the markup, a script in it would not run."""
    css = static_file("app.css").decode()  # type: ignore[union-attr]
    chart = static_file("chart.umd.min.js").decode()  # type: ignore[union-attr]
    app = static_file("app.js").decode()  # type: ignore[union-attr]
    # inside <script>, "</script" would end the element: every "<" in the data is written as \u003c
    payload = to_json(data).replace("<", "\\u003c")
    style, lib, code = f"\n{css}\n", f"\n{_script_safe(chart)}\n", f"\n{_script_safe(app)}\n"
    csp = (
        f"default-src 'none'; script-src {_sha256(lib)} {_sha256(code)}; style-src {_sha256(style)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    head = (
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n<style>{style}</style>\n<script>{lib}</script>'
    )
    body = f'<script id="goodput-data" type="application/json">{payload}</script>\n<script>{code}</script>'
    title = str(data.get("title") or "goodput sched report").replace("&", "&amp;").replace("<", "&lt;")
    parts = {"<!--HEAD-->": head, "<!--DATA-->": body, "<!--TITLE-->": title}
    # one pass: a marker inside what was put in (the data, a title) is never replaced in its turn
    return re.sub("<!--(HEAD|DATA|TITLE)-->", lambda m: parts[m.group(0)], _template())


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _script_safe(code: str) -> str:
    return code.replace("</script", "<\\/script")


SNAPSHOTS = 48  # the static report's cluster at this many instants, evenly spaced over the log


def _records(events: str | Path | list[dict[str, Any]]) -> Callable[[], Iterable[dict[str, Any]]]:
    """The log's records, readable more than once: a file is streamed on each pass (never held whole in
    memory: the replay keeps aggregates, so the report of a long log costs what the page shows)."""
    if not isinstance(events, (str, Path)):
        return lambda: events

    return lambda: iter_jsonl(events)


def _replay_with_snapshots(tl: Any, records: Callable[[], Iterable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Feed the records to ``tl``, taking the cluster view at evenly spaced instants (after every
    record at or before each instant), so the report can show the cluster mid-run, not only at the end.
    Two passes: the first (which also finds a malformed line before anything is drawn) for the span."""
    from .views import static_cluster

    t0, t1 = math.inf, -math.inf
    for r in records():
        t = r.get("t")
        if isinstance(t, (int, float)) and math.isfinite(t):
            t0, t1 = min(t0, t), max(t1, t)
    if not math.isfinite(t0):
        tl.feed(records())
        return []
    # fewer instants on a large cluster: the page stays a few MB (2048 nodes: 8 snapshots)
    n = max(8, min(SNAPSHOTS, 16384 // max(1, len(tl.capacity))))
    marks = [t0 + (t1 - t0) * (i + 1) / n for i in range(n)] if t1 > t0 else [t1]
    out: list[dict[str, Any]] = []
    k = 0
    for rec in records():
        t = rec.get("t")
        while k < len(marks) and isinstance(t, (int, float)) and t > marks[k]:
            out.append({"t": marks[k], "cluster": static_cluster(tl)})
            k += 1
        tl.feed((rec,))
    while k < len(marks):
        out.append({"t": marks[k], "cluster": static_cluster(tl)})
        k += 1
    return out


def write_report(
    events: str | Path | list[dict[str, Any]],
    out: str | Path,
    *,
    capacity: dict[str, int] | None = None,
    pool_kinds: dict[str, str] | None = None,
    meta: dict[str, dict[str, Any]] | None = None,
    policies: list[dict[str, Any]] | None = None,
    exact_ledger: dict[str, Any] | None = None,
    title: str = "",
    notes: list[str] | None = None,
) -> Path:
    """Write the static dashboard of an event log (a JSONL path or its records) to ``out`` (a file)."""
    from .timeline import Timeline
    from .views import static_report

    tl = Timeline(capacity, pool_kinds)
    snapshots = _replay_with_snapshots(tl, _records(events))
    data = static_report(
        tl,
        # a live service's log is on the wall clock (unix seconds), a simulator's counts from 0
        clock="wall" if math.isfinite(tl.t0) and tl.t0 > WALL_CLOCK_AFTER else "sim",
        meta=meta,
        snapshots=snapshots,
        policies=policies,
        exact_ledger=exact_ledger,
        title=title
        or (
            f"goodput sched report: {Path(events).name}" if isinstance(events, (str, Path)) else "goodput sched report"
        ),
    )
    data["notes"] = list(notes or [])
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(static_html(data), encoding="utf-8")
    return path
