"""Charts of a night, drawn on the server as SVG: no script, no build step, nothing from elsewhere.

From what the site already counts: rows given back per minute (the ledger's ``resolved_at``
of reverted rows, read through the index of reverted rows by module, or a run's own rows),
and, from the metrics' shared counters (`cleanup.counters`), module calls' latency (the
95th percentile's bucket of ``module_call_seconds``) and failures (``module_calls_total``
whose outcome is not ``ok``) by backend. Each is a fixed few queries whatever the ledger's
size.
May import models, `registry` (the modules whose rows are read) and `.lists` (a time).
"""

import json
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .. import registry
from ..counters import BUCKETS
from ..models import Counter, Resource, ResourceState, Run, backend_name

WIDTH, HEIGHT, LEFT, BOTTOM = 560, 150, 150, 22
MINUTES = 60
BACKENDS_SHOWN = 12


def _minutes(rows: QuerySet[Resource], since: datetime, minutes: int) -> list[int]:
    """Rows given back in each minute from ``since`` on, ``minutes`` of them."""
    start = since.replace(second=0, microsecond=0)
    counted = (
        rows.filter(
            state=ResourceState.REVERTED, resolved_at__gte=start, resolved_at__lt=start + timedelta(minutes=minutes)
        )
        .annotate(minute=TruncMinute("resolved_at"))
        .order_by()
        .values("minute")
        .annotate(n=Count("id"))
    )
    found = {row["minute"]: row["n"] for row in counted}
    return [found.get(start + timedelta(minutes=i), 0) for i in range(minutes)]


def given_back_per_minute(now: datetime | None = None) -> SafeString:
    """The site's last hour: rows given back per minute, over every module's rows."""
    now = now or timezone.now()
    rows = Resource.objects.filter(module__in=registry.modules())
    values = _minutes(rows, now - timedelta(minutes=MINUTES - 1), MINUTES)
    return columns(values, "rows given back per minute, the last hour", "chart-given-back")


def run_given_back_per_minute(run: Run) -> SafeString | None:
    """A run's own rows given back per minute, from its end (or start) on, at most an hour."""
    rows = Resource.objects.filter(run=run)
    first = rows.filter(state=ResourceState.REVERTED).order_by("resolved_at").values_list("resolved_at", flat=True)[:1]
    if not first or first[0] is None:
        return None
    values = _minutes(rows, first[0], MINUTES)
    while len(values) > 10 and not values[-1]:
        values.pop()
    return columns(values, "its rows given back per minute, from the first", "chart-run-given-back")


def columns(values: Sequence[int], title: str, element_id: str) -> SafeString:
    """A column per value, left to right, with the highest labelled."""
    top = max(max(values, default=0), 1)
    inner = WIDTH - 40
    width = inner / max(len(values), 1)
    parts = [_open(title, element_id), _text(4, 14, f"{title} (highest {top}, total {sum(values)})")]
    for i, n in enumerate(values):
        h = (HEIGHT - BOTTOM - 24) * n / top
        x = 30 + i * width
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{HEIGHT - BOTTOM - h:.1f}" width="{max(width - 1, 1):.1f}" '
            f'height="{h:.1f}" fill="#447e36"><title>{n}</title></rect>'
        )
    parts.append(f'<line x1="30" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - 10}" y2="{HEIGHT - BOTTOM}" stroke="#999"/>')
    parts.append(_text(30, HEIGHT - 6, f"{len(values)} min ago" if len(values) > 1 else ""))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text went through escape()


def _by_backend(name: str) -> dict[str, dict[str, float]]:
    """The counters of ``name``, summed per backend, each keyed by the label that tells them apart."""
    found: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in Counter.objects.filter(name=name).values_list("labels", "value"):
        label = json.loads(labels)
        who = backend_name(str(label.get("module", "")), str(label.get("backend", "")))
        found[who][str(label.get("le", label.get("outcome", "")))] += value
    return found


def failures_by_backend() -> SafeString:
    """Module calls that failed (an exception or a timeout), per backend, since the counters began."""
    calls = _by_backend("module_calls_total")
    values = [(who, sum(n for outcome, n in by.items() if outcome != "ok")) for who, by in sorted(calls.items())]
    return bars(values[:BACKENDS_SHOWN], "module calls failed, by backend", "chart-failures", "#ba2121", "{:.0f}")


def latency_by_backend() -> SafeString:
    """The 95th percentile of module calls' seconds per backend, as the bucket that holds it."""
    values = []
    for who, buckets in sorted(_by_backend("module_call_seconds_bucket").items()):
        total = sum(buckets.values())
        running, p95 = 0.0, float("inf")
        for bound in (*BUCKETS, float("inf")):
            running += buckets.get(str(bound) if bound != float("inf") else "+Inf", 0)
            if total and running >= 0.95 * total:
                p95 = bound
                break
        values.append((who, p95 if p95 != float("inf") else BUCKETS[-1] * 2))
    return bars(
        values[:BACKENDS_SHOWN], "module calls' latency, 95th percentile (s)", "chart-latency", "#205067", "≤ {:g} s"
    )


def bars(values: Sequence[tuple[str, float]], title: str, element_id: str, color: str, shown: str) -> SafeString:
    """A horizontal bar per named value."""
    height = 24 + 18 * max(len(values), 1)
    top = max((v for _, v in values), default=0) or 1
    parts = [_open(title, element_id, height), _text(4, 14, title)]
    if not values:
        parts.append(_text(4, 34, "nothing counted yet"))
    for i, (name, value) in enumerate(values):
        y = 22 + 18 * i
        w = (WIDTH - LEFT - 80) * value / top
        parts.append(_text(LEFT - 6, y + 12, name, anchor="end"))
        parts.append(
            f'<rect class="bar" x="{LEFT}" y="{y + 2}" width="{w:.1f}" height="13" fill="{color}">'
            f"<title>{escape(name)}: {escape(shown.format(value))}</title></rect>"
        )
        parts.append(_text(LEFT + w + 4, y + 12, shown.format(value)))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text went through escape()


def _open(title: str, element_id: str, height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{element_id}" class="chart" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">'
    )


def _text(x: float, y: float, text: str, anchor: str = "start") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="#333">{escape(text)}</text>'
