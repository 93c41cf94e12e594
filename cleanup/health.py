"""``/healthz``: is this site able to do its work? For a load balancer or a probe.

Healthy means the database answers and the background is alive: django-q2's scheduler
moves the tick's ``next_run`` forward each time it queues the tick (every minute), so a
``next_run`` long in the past means no scheduler is running, and nothing would advance
runs or give back what ended runs hold. The answer carries no detail beyond ``ok``.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from .tasks import SCHEDULE_NAME

logger = logging.getLogger(__name__)

# The tick is due every minute; a few missed ones are a slow worker, more is no worker.
STALE_AFTER_S = 300


def stale_after():
    return timedelta(seconds=getattr(settings, "EVENT_HEALTH_STALE_S", STALE_AFTER_S))


def healthy(now=None):
    """True when the database answers and the tick's schedule was fired recently."""
    from django_q.models import Schedule

    now = now or timezone.now()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        next_runs = list(Schedule.objects.filter(name=SCHEDULE_NAME).values_list("next_run", flat=True))
    except DatabaseError:
        logger.warning("health check: the database does not answer", exc_info=True)
        return False
    if not any(next_run and next_run >= now - stale_after() for next_run in next_runs):
        logger.warning("health check: the tick's schedule has not fired since %s", max(filter(None, next_runs),
                                                                                        default=None))
        return False
    return True


# Exempt from the CSRF check, which would answer 403 to an unsafe method before
# `require_safe` could answer 405: this view reads only, whatever the method.
@csrf_exempt
@never_cache
@require_safe
def healthz(request):
    if healthy():
        return HttpResponse("ok\n", content_type="text/plain")
    return HttpResponse("not ok\n", content_type="text/plain", status=503)
