"""A picture of one run, drawn on the server as SVG: no script, nothing from elsewhere.

From left to right, the run's life: when each step was performed (or failed), each set
apart from one that ended in the same moment; how many resources it took, and how many
were given back, waived or found gone, each its own curve drawn on to the right edge so
a give-back at the very end is seen; the outages of the backends it used, as bands; each
failed cleanup attempt, a person's retries, and the moment the cleanup gave up or
completed. It is drawn in a viewBox and scales to the page's width. The queries are a
fixed few whatever the run's size: the curves are counted per time slice in one
aggregate, and the markers are capped.
May import: the models only. Reads only.
"""

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Min, Q
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .models import (
    STEP_KIND,
    CleanupStatus,
    LogKind,
    ModuleEvent,
    ModuleEventKind,
    Resource,
    ResourceState,
    Run,
    RunLog,
    Step,
    backend_name,
)

# Where a moment is drawn, across.
Across = Callable[[datetime], float]

# The picture is drawn in these units and scaled to the page's width (viewBox, width 100%).
WIDTH, HEIGHT = 1200, 262
LEFT, RIGHT = 56, 120  # the right margin carries each curve's final count
STEPS_Y, CHART_TOP, CHART_BOTTOM, CLEANUP_Y = 24, 60, 176, 198
SLICES = 64
# Past the last moment, the curves go on at their final level, so a give-back at the very
# end is seen as a line of its own, not hidden under the completion bar.
TAIL = 0.05
DOT, LANES = 5, 3
MARKERS = 300
# Moments the curves are also counted at, besides the slices: a run's end and its steps'
# ends, so that what a step took is drawn where it took it, before the run's end, not at
# the next slice after it.
MOMENTS = 32
MARKED: dict[str, tuple[str, str]] = {
    LogKind.STEP_FAILED: ("step attempt failed", "#ba2121"),
    LogKind.CLEANUP_FAILED: ("failed attempt", "#ba2121"),
    LogKind.CLEANUP_RETRY: ("a person's retry", "#205067"),
    LogKind.CLEANUP_GAVE_UP: ("cleanup gave up", "#e07000"),
    LogKind.CLEANUP_RECOVERED: ("cleanup completed", "#447e36"),
    LogKind.RUN_COMPLETED: ("run completed", "#666"),
    LogKind.RUN_CANCELLED: ("run cancelled", "#666"),
    LogKind.RUN_ABORTED: ("run aborted", "#666"),
    # A backend's dead-man's switch gave back what the run held there (rule 34).
    LogKind.BACKEND_LAPSED: ("the backend's switch gave back", "#b8860b"),
}
# The curves: what the run took, and how each row left the ledger, apart.
CURVES: list[tuple[str, str | None, str, str]] = [
    ("taken", None, "#205067", ""),
    ("given back", ResourceState.REVERTED, "#447e36", ""),
    ("waived", ResourceState.WAIVED, "#8e44ad", "6,3"),
    ("gone from the world", ResourceState.ORPHANED, "#888", "2,3"),
]
OUTAGE_FILL = "#f5c542"


def svg(run: Run) -> SafeString:
    rows = Resource.objects.filter(run=run).exclude(kind=STEP_KIND)
    span = rows.aggregate(first=Min("created_at"), resolved=Max("resolved_at"))
    last_log = RunLog.objects.filter(run=run).order_by("-id").values_list("at", flat=True).first()
    start = min(t for t in (run.created_at, span["first"]) if t is not None)
    end = max(t for t in (run.ended_at, span["resolved"], last_log, start) if t is not None)
    if not run.is_terminal or run.cleanup_status == CleanupStatus.PENDING:
        end = max(end, timezone.now())
    length = max((end - start).total_seconds(), 1.0)
    end = start + timedelta(seconds=length)
    shown = length * (1 + TAIL)

    def x(t: datetime) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * min(max((t - start).total_seconds() / shown, 0), 1)

    cuts = [start + timedelta(seconds=length * i / SLICES) for i in range(SLICES + 1)]
    cuts = sorted({*cuts, *(t for t in _moments(run) if start < t < end)})
    counts = rows.aggregate(
        **{f"t{i}": Count("id", filter=Q(created_at__lte=c)) for i, c in enumerate(cuts)},
        **{
            f"{state}{i}": Count("id", filter=Q(state=state, resolved_at__lte=c))
            for _, state, _, _ in CURVES[1:]
            for i, c in enumerate(cuts)
        },
    )
    curves: list[tuple[str, list[int], str, str]] = []
    for name, state, color, dash in CURVES:
        values = [counts[f"{state or 't'}{i}"] for i in range(len(cuts))]
        if state is None or values[-1] or state == ResourceState.REVERTED:
            curves.append((name, values, color, dash))
    top = max(max(curves[0][1]), 1)

    def y(n: float) -> float:
        return CHART_BOTTOM - (CHART_BOTTOM - CHART_TOP) * n / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
        'preserveAspectRatio="xMinYMin meet" role="img" aria-label="timeline of the run" '
        'font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
    ]
    # Bands first: everything else is drawn over them.
    parts += _outages(run, start, start + timedelta(seconds=shown), x)
    parts += [
        _label(4, STEPS_Y + 4, "steps"),
        _label(4, (CHART_TOP + CHART_BOTTOM) / 2, "rows"),
        _label(4, CLEANUP_Y + 4, "cleanup"),
        f'<line x1="{LEFT}" y1="{CHART_BOTTOM}" x2="{WIDTH - RIGHT}" y2="{CHART_BOTTOM}" stroke="#999"/>',
        _label(LEFT - 4, y(top) + 4, str(top), anchor="end"),
        _label(LEFT - 4, CHART_BOTTOM + 4, "0", anchor="end"),
    ]
    parts += _step_marks(run, x)
    complete = run.cleanup_status == CleanupStatus.COMPLETE and span["resolved"]
    # The completion bar stands for the cleanup's last recovery too: one bar, not two.
    parts += _log_marks(run, x, completion_drawn=bool(complete))
    if complete:
        parts.append(_bar(x(span["resolved"]), "#447e36", f"cleanup complete at {_t(span['resolved'])}"))
    # The curves over the bars, the give-backs over what was taken, each to the right edge.
    tail = start + timedelta(seconds=shown)
    ends = []
    for name, values, color, dash in curves:
        parts.append(_steps_path([*cuts, tail], [*values, values[-1]], x, y, color, name, dash))
        ends.append((y(values[-1]), f"{name} {values[-1]}", color))
    parts += _end_labels(ends, WIDTH - RIGHT + 6)
    for i, frac in enumerate((0, 0.5, 1)):
        at = start + timedelta(seconds=length * frac)
        anchor = ("start", "middle", "end")[i]
        parts.append(_label(x(at), CLEANUP_Y + 26, _t(at), anchor=anchor))
    parts.append(_legend())
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text in it went through escape()


def _moments(run: Run) -> list[datetime]:
    """The run's end and its first steps' ends (at most ``MOMENTS``)."""
    ends = Step.objects.filter(run=run, finished_at__isnull=False).order_by("position")
    found = [t for t in ends.values_list("finished_at", flat=True)[:MOMENTS] if t is not None]
    return [*found, run.ended_at] if run.ended_at else found


def _t(at: datetime) -> str:
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S %Z")


def _label(x: float, y: float, text: str, anchor: str = "start", color: str = "#333") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}">{escape(text)}</text>'


def _steps_path(
    cuts: Sequence[datetime],
    values: Sequence[int],
    x: Across,
    y: Callable[[float], float],
    color: str,
    name: str,
    dash: str = "",
) -> str:
    points = []
    for i, (at, n) in enumerate(zip(cuts, values, strict=True)):
        if i:
            points.append(f"{x(at):.1f},{y(values[i - 1]):.1f}")
        points.append(f"{x(at):.1f},{y(n):.1f}")
    return (
        f'<polyline class="curve" data-curve="{escape(name)}" fill="none" stroke="{color}" stroke-width="2"'
        + (f' stroke-dasharray="{dash}"' if dash else "")
        + f' points="{" ".join(points)}"><title>{escape(name)}: {values[-1]}</title></polyline>'
    )


def _step_marks(run: Run, x: Across) -> list[str]:
    """A dot per step at the moment it finished (or started); steps that ended within a
    dot's width of each other are set apart, on the next lane down or just to the right,
    so each one is seen and hovered on its own."""
    marks = []
    steps = (
        Step.objects.filter(run=run)
        .order_by("position")
        .values_list("position", "action_id", "status", "finished_at", "started_at", "last_error")[:MARKERS]
    )
    gap = 2 * DOT + 2
    lanes = [float("-inf")] * LANES
    for position, action_id, status, finished, started, error in steps:
        at = finished or started
        if at is None:
            continue
        cx = x(at)
        free = [i for i, last in enumerate(lanes) if cx - last >= gap]
        lane = free[0] if free else min(range(LANES), key=lambda i: lanes[i])
        if not free:
            cx = min(lanes[lane] + gap, WIDTH - RIGHT)
        lanes[lane] = cx
        color = {"failed": "#ba2121", "cancelled": "#999"}.get(status, "#205067")
        text = f"step {position} {action_id}: {status} at {_t(at)}" + (f" ({error[:200]})" if error else "")
        marks.append(
            f'<circle class="step" cx="{cx:.1f}" cy="{STEPS_Y + lane * (gap - 1)}" r="{DOT}" fill="{color}">'
            f"<title>{escape(text)}</title></circle>"
        )
    return marks


def _outages(run: Run, start: datetime, end: datetime, x: Across) -> list[str]:
    """A band for each outage of a backend the run's rows are on, while the run was drawn:
    from its mark-down to its mark-up (or to the picture's end while it lasts)."""
    pairs = set(Resource.objects.filter(run=run).order_by().values_list("module", "backend").distinct()[:50])
    if not pairs:
        return []
    events = (
        ModuleEvent.objects.filter(module__in={m for m, _ in pairs}, at__lte=end)
        .order_by("-at", "-id")
        .values_list("module", "backend", "kind", "at", "detail")[:MARKERS]
    )
    down: dict[tuple[str, str], tuple[datetime, Any]] = {}
    bands: list[tuple[str, str, datetime, datetime | None, Any, str | None]] = []
    for module, backend, kind, at, detail in reversed(list(events)):
        if (module, backend) not in pairs:
            continue
        if kind == ModuleEventKind.DOWN:
            down.setdefault((module, backend), (at, detail))
        elif (module, backend) in down:
            since, why = down.pop((module, backend))
            bands.append((module, backend, since, at, why, kind))
    bands += [(m, b, since, None, why, None) for (m, b), (since, why) in down.items()]
    out = []
    for module, backend, since, until, why, ended_by in bands:
        if until is not None and until < start:
            continue
        left, right = x(since), x(until or end)
        name = backend_name(module, backend)
        reason = why.get("reason") or why.get("error") or "" if isinstance(why, dict) else ""
        if until is None:
            ended = ", still down"
        else:
            ended = f" to {_t(until)}" + (" (waiting given up)" if ended_by == ModuleEventKind.GAVE_UP else "")
        text = f"{name} down from {_t(since)}" + ended + (f": {reason}" if reason else "")
        out.append(
            f'<rect class="outage" x="{left:.1f}" y="{STEPS_Y - 10}" width="{max(right - left, 2):.1f}" '
            f'height="{CLEANUP_Y + 8 - STEPS_Y + 10}" fill="{OUTAGE_FILL}" fill-opacity="0.3">'
            f"<title>{escape(text[:300])}</title></rect>"
        )
        out.append(_label(left + 3, CHART_TOP - 14, f"{name} down", color="#8a6d00"))
    return out


def _end_labels(ends: list[tuple[float, str, str]], left: float) -> list[str]:
    """Each curve's final count at the right edge, moved apart when two would overlap."""
    out: list[str] = []
    last: float | None = None
    for level, text, color in sorted(ends):
        at = level + 4 if last is None else max(level + 4, last + 12)
        last = at
        out.append(_label(left, at, text, color=color))
    return out


def _log_marks(run: Run, x: Across, completion_drawn: bool = False) -> list[str]:
    """The log's marks, newest first; with ``completion_drawn``, the newest recovery is that bar."""
    marks = []
    entries = (
        RunLog.objects.filter(run=run, kind__in=list(MARKED))
        .order_by("-id")
        .values_list("kind", "at", "detail")[:MARKERS]
    )
    skip_recovery = completion_drawn
    for kind, at, detail in entries:
        if kind == LogKind.CLEANUP_RECOVERED and skip_recovery:
            skip_recovery = False
            continue
        name, color = MARKED[kind]
        error = (detail.get("error") or detail.get("reason") or "") if isinstance(detail, dict) else ""
        text = f"{name} at {_t(at)}" + (f": {error[:200]}" if error else "")
        cx = x(at)
        if kind == LogKind.STEP_FAILED:
            # A step's failed attempt, on the steps' line: a retried step's failure is seen too.
            marks.append(
                f'<path class="step-failed" d="M{cx - 4:.1f},{STEPS_Y - 4} l8,8 m0,-8 l-8,8" stroke="{color}" '
                f'stroke-width="2"><title>{escape(text)}</title></path>'
            )
        elif kind == LogKind.CLEANUP_FAILED:
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


def _bar(cx: float, color: str, text: str) -> str:
    return (
        f'<rect x="{cx - 2:.1f}" y="{CHART_TOP - 6}" width="4" height="{CLEANUP_Y + 8 - CHART_TOP}" '
        f'fill="{color}"><title>{escape(text)}</title></rect>'
    )


def _legend() -> str:
    items = [
        ("#205067", "taken"),
        ("#447e36", "given back / completed"),
        ("#8e44ad", "waived"),
        (OUTAGE_FILL, "outage"),
        ("#ba2121", "failed attempt"),
        ("#205067", "retry (triangle)"),
        ("#e07000", "gave up"),
        ("#666", "run ended (dashed)"),
    ]
    out: list[str] = []
    cx: float = LEFT
    for color, text in items:
        out.append(f'<rect x="{cx}" y="{HEIGHT - 14}" width="10" height="10" fill="{color}"/>')
        out.append(_label(cx + 14, HEIGHT - 5, text))
        cx += 24 + 6.2 * len(text)
    return "".join(out)
