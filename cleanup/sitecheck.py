"""``/healthz``: is this site able to do its work? For a load balancer or a probe.
Imports `cleanup.conf`, the tick's schedule names from `cleanup.tasks`, and django-q2's models.

Healthy means the database answers and a django-q2 cluster runs the tick: the tick's
schedule is there, and a worker finished a tick fired from it within the last few
minutes. The schedule's own ``next_run`` cannot tell that: `migrate` creates it due at
once, so it looks fresh for minutes although nothing ever ran it. A tick's result is
what only a running cluster leaves: its scheduler queues the tick in the schedule's
group, a worker runs it, and the cluster saves the result with the time it stopped.
Without a cluster nothing would advance runs or give back what ended runs hold. The
answer carries no detail beyond ``ok``, but with ``?detail=1`` for staff, a loopback
address or the metrics token (`cleanup.metrics.allowed`): then what is wrong, and each
cluster's clock against the database's (`cleanup.skew`), flagged past 5 s.
May import: `tasks` (the schedule's name), conf, `skew`, `metrics` (who may read the detail).
"""

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from . import skew
from .conf import setting
from .metrics import allowed
from .tasks import SCHEDULE_FUNC, SCHEDULE_NAME

logger = logging.getLogger(__name__)


def stale_after() -> timedelta:
    return timedelta(seconds=setting("EVENT_HEALTH_STALE_S"))


def ticks() -> Any:
    """The schedule's ticks that a worker finished, through django-q2's index of
    successful tasks by group (``success_index``). django-q2 keeps the newest
    ``save_limit`` results, so the last minute's tick is there."""
    from django_q.models import Success

    return Success.objects.filter(group=SCHEDULE_NAME, func=SCHEDULE_FUNC)


def healthy(now: datetime | None = None) -> bool:
    """True when the database answers and a cluster finished a tick of the schedule recently."""
    try:
        problem = _problem(now or timezone.now())
    except DatabaseError:
        logger.warning("health check: the database does not answer", exc_info=True)
        return False
    if problem:
        logger.warning("health check: %s", problem)
    return problem is None


def _problem(now: datetime) -> str | None:
    """What keeps the background from working, or None."""
    from django_q.models import Schedule

    if not Schedule.objects.filter(name=SCHEDULE_NAME).exists():
        return "the tick's schedule is missing"
    if ticks().filter(stopped__gte=now - stale_after()).exists():
        return None
    last = ticks().order_by("-stopped").values_list("stopped", flat=True).first()
    return f"no cluster has finished a tick since {last}" if last else "no cluster has finished a tick yet"


# Exempt from the CSRF check, which would answer 403 to an unsafe method before
# `require_safe` could answer 405: this view reads only, whatever the method.
@csrf_exempt
@never_cache
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    ok = healthy()
    body = "ok\n" if ok else "not ok\n"
    if request.GET.get("detail", "0").lower() not in ("0", "false", "no"):
        body += detail() if may_read_detail(request) else "detail: for staff, loopback, or the metrics token\n"
    return HttpResponse(body, content_type="text/plain", status=200 if ok else 503)


def may_read_detail(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff) or allowed(request)


def detail() -> str:
    """What ``?detail=1`` adds: whether a cluster ticks, and the clusters' clocks."""
    try:
        problem = _problem(timezone.now())
        clocks = list(skew.readings())
    except DatabaseError:
        return "database: does not answer\n"
    lines = [f"tick: {problem}" if problem else "tick: a cluster finished one recently"]
    lines.append(
        "worker clocks (each cluster's clock minus the database's; claims use the database's clock,"
        f" so an offset moves only log times; flagged past {skew.WARN_S:g} s):"
    )
    lines += [f"  {skew.line(reading, stamped=True)}" for reading in clocks] or [
        f"  none recorded in the last {skew.RECENT.total_seconds() / 3600:g} h"
    ]
    return "\n".join(lines) + "\n"
