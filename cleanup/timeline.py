"""A picture of one run, drawn on the server as SVG: no script, nothing from elsewhere.

From left to right, the run's life: when each step was performed (or failed), how many
resources it held as they were taken and given back, each failed cleanup attempt, a
person's retries, and the moment the cleanup gave up or completed. The queries are a
fixed few whatever the run's size: the curves are counted per time slice in one
aggregate, and the markers are capped.
May import: the models only. Reads only.
"""

from datetime import timedelta

from django.db.models import Count, Max, Min, Q
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from .models import RESOLVED, STEP_KIND, CleanupStatus, LogKind, Resource, RunLog, Step

WIDTH, HEIGHT = 960, 250
LEFT, RIGHT = 56, 16
STEPS_Y, CHART_TOP, CHART_BOTTOM, CLEANUP_Y = 26, 48, 168, 190
SLICES = 32
MARKERS = 300
MARKED = {
    LogKind.CLEANUP_FAILED: ("failed attempt", "#ba2121"),
    LogKind.CLEANUP_RETRY: ("a person's retry", "#205067"),
    LogKind.CLEANUP_GAVE_UP: ("cleanup gave up", "#e07000"),
    LogKind.CLEANUP_RECOVERED: ("cleanup completed", "#447e36"),
    LogKind.RUN_COMPLETED: ("run completed", "#666"),
    LogKind.RUN_CANCELLED: ("run cancelled", "#666"),
    LogKind.RUN_ABORTED: ("run aborted", "#666"),
}


def svg(run):
    rows = Resource.objects.filter(run=run).exclude(kind=STEP_KIND)
    span = rows.aggregate(first=Min("created_at"), resolved=Max("resolved_at"))
    last_log = RunLog.objects.filter(run=run).order_by("-id").values_list("at", flat=True).first()
    start = min(t for t in (run.created_at, span["first"]) if t is not None)
    end = max(t for t in (run.ended_at, span["resolved"], last_log, start) if t is not None)
    if not run.is_terminal or run.cleanup_status == CleanupStatus.PENDING:
        end = max(end, timezone.now())
    length = max((end - start).total_seconds(), 1.0)
    end = start + timedelta(seconds=length)

    def x(t):
        return LEFT + (WIDTH - LEFT - RIGHT) * min(max((t - start).total_seconds() / length, 0), 1)

    cuts = [start + timedelta(seconds=length * i / SLICES) for i in range(SLICES + 1)]
    counts = rows.aggregate(
        **{f"t{i}": Count("id", filter=Q(created_at__lte=c)) for i, c in enumerate(cuts)},
        **{f"g{i}": Count("id", filter=Q(state__in=RESOLVED, resolved_at__lte=c)) for i, c in enumerate(cuts)},
    )
    taken = [counts[f"t{i}"] for i in range(SLICES + 1)]
    given = [counts[f"g{i}"] for i in range(SLICES + 1)]
    top = max(max(taken), 1)

    def y(n):
        return CHART_BOTTOM - (CHART_BOTTOM - CHART_TOP) * n / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        'role="img" aria-label="timeline of the run" font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
        _label(4, STEPS_Y + 4, "steps"),
        _label(4, (CHART_TOP + CHART_BOTTOM) / 2, "rows"),
        _label(4, CLEANUP_Y + 4, "cleanup"),
        f'<line x1="{LEFT}" y1="{CHART_BOTTOM}" x2="{WIDTH - RIGHT}" y2="{CHART_BOTTOM}" stroke="#999"/>',
        _label(LEFT - 4, y(top) + 4, str(top), anchor="end"),
        _label(LEFT - 4, CHART_BOTTOM + 4, "0", anchor="end"),
        _steps_path(cuts, taken, x, y, "#205067", "taken"),
        _steps_path(cuts, given, x, y, "#447e36", "given back"),
    ]
    parts += _step_marks(run, x)
    parts += _log_marks(run, x)
    if run.cleanup_status == CleanupStatus.COMPLETE and span["resolved"]:
        parts.append(_bar(x(span["resolved"]), "#447e36", f"cleanup complete at {_t(span['resolved'])}"))
    for i, frac in enumerate((0, 0.5, 1)):
        at = start + timedelta(seconds=length * frac)
        anchor = ("start", "middle", "end")[i]
        parts.append(_label(x(at), CLEANUP_Y + 26, _t(at), anchor=anchor))
    parts.append(_legend())
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text in it went through escape()


def _t(at):
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S")


def _label(x, y, text, anchor="start", color="#333"):
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}">{escape(text)}</text>'


def _steps_path(cuts, values, x, y, color, name):
    points = []
    for i, (at, n) in enumerate(zip(cuts, values, strict=True)):
        if i:
            points.append(f"{x(at):.1f},{y(values[i - 1]):.1f}")
        points.append(f"{x(at):.1f},{y(n):.1f}")
    return (
        f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(points)}">'
        f"<title>{escape(name)}: {values[-1]}</title></polyline>"
    )


def _step_marks(run, x):
    marks = []
    steps = (
        Step.objects.filter(run=run)
        .order_by("position")
        .values_list("position", "action_id", "status", "finished_at", "started_at", "last_error")[:MARKERS]
    )
    for position, action_id, status, finished, started, error in steps:
        at = finished or started
        if at is None:
            continue
        color = "#ba2121" if status == "failed" else "#205067"
        text = f"step {position} {action_id}: {status} at {_t(at)}" + (f" ({error[:200]})" if error else "")
        marks.append(
            f'<circle cx="{x(at):.1f}" cy="{STEPS_Y}" r="5" fill="{color}"><title>{escape(text)}</title></circle>'
        )
    return marks


def _log_marks(run, x):
    marks = []
    entries = (
        RunLog.objects.filter(run=run, kind__in=list(MARKED))
        .order_by("-id")
        .values_list("kind", "at", "detail")[:MARKERS]
    )
    for kind, at, detail in entries:
        name, color = MARKED[kind]
        error = detail.get("error", "") if isinstance(detail, dict) else ""
        text = f"{name} at {_t(at)}" + (f": {error[:200]}" if error else "")
        cx = x(at)
        if kind == LogKind.CLEANUP_FAILED:
            marks.append(
                f'<path d="M{cx - 4:.1f},{CLEANUP_Y - 4} l8,8 m0,-8 l-8,8" stroke="{color}" '
                f'stroke-width="2"><title>{escape(text)}</title></path>'
            )
        elif kind == LogKind.CLEANUP_RETRY:
            marks.append(
                f'<path d="M{cx:.1f},{CLEANUP_Y - 6} l6,10 l-12,0 z" fill="{color}">'
                f"<title>{escape(text)}</title></path>"
            )
        elif kind.startswith("run."):
            marks.append(
                f'<line x1="{cx:.1f}" y1="{CHART_TOP - 6}" x2="{cx:.1f}" y2="{CHART_BOTTOM}" '
                f'stroke="{color}" stroke-dasharray="3,3"><title>{escape(text)}</title></line>'
            )
        else:
            marks.append(_bar(cx, color, text))
    return marks


def _bar(cx, color, text):
    return (
        f'<rect x="{cx - 2:.1f}" y="{CHART_TOP - 6}" width="4" height="{CLEANUP_Y + 8 - CHART_TOP}" '
        f'fill="{color}"><title>{escape(text)}</title></rect>'
    )


def _legend():
    items = [
        ("#205067", "taken"),
        ("#447e36", "given back / completed"),
        ("#ba2121", "failed attempt"),
        ("#205067", "retry (triangle)"),
        ("#e07000", "gave up"),
        ("#666", "run ended (dashed)"),
    ]
    out, cx = [], LEFT
    for color, text in items:
        out.append(f'<rect x="{cx}" y="{HEIGHT - 14}" width="10" height="10" fill="{color}"/>')
        out.append(_label(cx + 14, HEIGHT - 5, text))
        cx += 24 + 6.2 * len(text)
    return "".join(out)
