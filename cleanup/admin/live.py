"""Pages that stay current: the fragments the admin's live bar reads again, and the live view.

The index, a run's page and the ledger list carry a live bar (`cleanup_admin.live_bar`)
and the static script ``cleanup/live.js``; every ``EVENT_ADMIN_REFRESH_S`` the script
reads the page's fragment and brings its parts up to date in place. Each fragment is a
view of its own under the admin, behind the same permission as its page, checked before
any query, and as bounded as its page (the same caps): ``run/live-index/`` (the index's
counts and the live view), ``run/<id>/live/`` (a run's status, rows, timeline, plan,
steps and log), ``resource/live/`` (the ledger list's rows, with the list's filters).

`live_now` is the live view of the index: the running runs, newest first, each with the
step it is at (and a wait's time left) and what it holds, in words.

May import models, `.lists` and `.summaries`; the admin's pages and the template tags import it.
"""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from ..models import Run, RunStatus, Step, StepStatus
from .lists import ago, filtered, mark_steps_waiting
from .summaries import holdings

LIVE_RUNS = 10
OPEN = (StepStatus.PENDING, StepStatus.RUNNING)


def index_fragment(request: HttpRequest) -> TemplateResponse:
    """The index's live part: the counts that need a person and the live view."""
    if not request.user.is_active or not request.user.is_staff:
        raise PermissionDenied
    return TemplateResponse(request, "admin/cleanup/index_live.html", {})


def live_now(request: HttpRequest) -> dict[str, Any]:
    """The running runs, newest first, capped at `LIVE_RUNS`: their step now and what they hold."""
    if not request.user.has_perm("cleanup.view_run"):
        return {"shown": False}
    running = Run.objects.filter(status=RunStatus.RUNNING)
    runs = list(running.annotate(_step_total=Count("steps")).order_by("-id")[:LIVE_RUNS])
    steps = current_steps(runs)
    held: dict[int, str] = holdings([r.pk for r in runs]) if request.user.has_perm("cleanup.view_resource") else {}
    now = timezone.now()
    shown = []
    for run in runs:
        step = steps.get(run.pk)
        shown.append(
            {
                "run": run,
                "link": reverse("admin:cleanup_run_change", args=[run.pk]),
                "step": step_text(step, run, now) if step else None,
                "waiting": getattr(step, "waiting", None),
                "holds": held.get(run.pk, ""),
            }
        )
    total = len(runs) if len(runs) < LIVE_RUNS else running.count()
    return {
        "shown": True,
        "runs": shown,
        "total": total,
        "link": filtered("run", status__exact=RunStatus.RUNNING),
    }


def current_steps(runs: Iterable[Run]) -> dict[int, Step]:
    """``{run_id: step}``: each run's first step not done (read by the unique (run, position)
    index, one query per shown run at most), with why it waits, if it does."""
    found: dict[int, Step] = {}
    for run in runs:
        step = Step.objects.filter(run=run, status__in=OPEN).order_by("position").first()
        if step is not None:
            found[run.pk] = step
    mark_steps_waiting(list(found.values()))
    return found


def step_text(step: Step, run: Run, now: datetime) -> str:
    """``step 2 of 3: core.wait, 42 s left`` or ``step 1 of 3: sandbox.spawn (running)``."""
    total = getattr(run, "_step_total", None)
    where = f"step {step.position + 1}" + (f" of {total}" if total else "")
    text = f"{where}: {step.action_id}"
    if step.action_id == "core.wait" and run.wake_at:
        left = (run.wake_at - now).total_seconds()
        return f"{text}, {ago(max(0, left))} left" if left > 0 else f"{text}, ends now"
    return f"{text} ({step.status})"
