"""Pages that stay current: the fragments the admin's live bar reads again, and the live view.

The index, a run's page and the ledger list carry a live bar (`cleanup_admin.live_bar`)
and the static script ``cleanup/live.js``; every ``EVENT_ADMIN_REFRESH_S`` the script
reads the page's fragment and brings its parts up to date in place. Each fragment is a
view of its own under the admin, behind the same permission as its page, checked before
any query, and as bounded as its page (the same caps): ``run/live-index/`` (the index's
counts, the live view and the night's charts), ``run/<id>/live/`` (a run's status, rows, timeline, plan,
steps and log), ``resource/live/`` (the ledger list's rows, with the list's filters).

Each fragment answers with an ``ETag`` made from what it shows (`unless_unchanged`); the
script sends it back as ``If-None-Match`` and a fragment that did not change answers
``304 Not Modified`` with no body: an open page that nothing changes costs a few hundred
bytes a read, not its whole fragment again.

`live_now` is the live view of the index: the running runs, newest first, each with the
step it is at (and a wait's time left) and what it holds, in words.

May import models, `.lists` and `.summaries`; the admin's pages and the template tags import it.
"""

import hashlib
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import wraps
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseNotModified
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import parse_etags

from ..models import Run, RunStatus, Step, StepStatus
from .lists import ago, filtered, mark_steps_waiting
from .summaries import holdings

LIVE_RUNS = 10
OPEN = (StepStatus.PENDING, StepStatus.RUNNING)


# A form's CSRF token is masked afresh on every answer: left out of what the tag is made
# from, or no fragment with a form would ever be unchanged. (Any masked token of the
# session's secret is accepted, so the one already on the page stays good.)
MASKED_TOKEN = re.compile(rb'(name="csrfmiddlewaretoken" value=")[^"]*(")')


def fragment_tag(content: bytes) -> str:
    """A fragment's entity tag: the hash of what it shows, its CSRF tokens left out."""
    return '"' + hashlib.sha256(MASKED_TOKEN.sub(rb"\1\2", content)).hexdigest()[:32] + '"'


def unless_unchanged(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """A fragment view answering ``304 Not Modified`` when it would show what the page holds.

    The answer is made as before (behind its permission, in its snapshot), then tagged; when
    the request's ``If-None-Match`` names that tag, only the tag goes back.
    """

    @wraps(view)
    def answer(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        if response.status_code != 200 or not isinstance(response, HttpResponse):
            return response
        if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
            response.render()
        tag = fragment_tag(response.content)
        if tag in parse_etags(request.headers.get("If-None-Match", "")):
            response = HttpResponseNotModified()
        response["ETag"] = tag
        return response

    return answer


def index_fragment(request: HttpRequest) -> TemplateResponse:
    """The index's live parts: the counts that need a person, the live view and the night's charts."""
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
