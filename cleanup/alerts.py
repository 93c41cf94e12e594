"""Telling staff when a run's cleanup gives up, and when it later completes.
Imports the models and `cleanup.conf`, nothing of the pass: it reads what the runs say.

Transitions are read from the runs themselves, never from inside the sweep: a run whose
``cleanup_status`` is `incomplete` while ``alerted_status`` says staff were not told so
(or `complete` after they were told it gave up) is due. `notice` claims each due run with
a conditional UPDATE of ``alerted_status`` (the row count says which of several sweepers
tells it) and, in the same transaction, writes the log entry (`cleanup.gave_up` or
`cleanup.recovered`) and one outbox row per channel (`Alert`). `deliver` then sends the
outbox outside any transaction, each row claimed first; a dead or slow webhook costs at
most its timeout, is recorded on the row and tried again later with a backoff. Staff are
told once per transition (rule 30).

A module's backend going down and coming back are told the same way, once per change
rather than once per run it holds up: `notice_modules` claims each `ModuleEvent`
(``module.down``, ``module.up``) by a conditional UPDATE of its ``alerted_at`` and writes
its outbox in the same transaction.
Staff were told only when a mail or webhook was accepted: a change told with no
destination set (no ``ADMINS``, no ``EVENT_ALERT_WEBHOOK_URL``) has no outbox and says so
(`nowhere`), and a module change keeps when a message about it was accepted (``told_at``).

A webhook's body is JSON with links to the admin's page and to the API. With
``EVENT_ALERT_WEBHOOK_SECRET`` set, each delivery is signed: ``X-Eventsite-Delivery`` is
the message's id (the same on every retry of it), and ``X-Eventsite-Signature`` is
``t=<unix seconds>,v2=<hex HMAC-SHA256 of "<t>.<delivery id>.<body>" under the secret>``:
the id and the time are signed with the body, so a captured delivery sent again under
another id does not verify (``v1``, over "<t>.<body>" alone, is still sent for receivers
that check it; docs/api.md shows how a receiver checks ``v2`` and ignores a delivery seen).

Stored text (a run's name, a ref, an error, a reason, who) reaches a mail or a webhook only
through `validation.one_line`, in the message as it is queued and again as a mail is
written: a CR/LF or a bidirectional control stored before names were checked, or
answered by a module, adds no header and no line, and reads as the escape it is.
May import: the models, conf, `clock`, `logs`, `validation` and the row owner's counts (`rows`); never
the pass, which knows nothing of alerts.
"""

import hashlib
import hmac
import json
import logging
import time
import uuid
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import mail_admins
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from . import clock
from .conf import setting
from .logs import about
from .models import (
    TERMINAL,
    UNRESOLVED,
    Alert,
    AlertChannel,
    AlertedStatus,
    CleanupStatus,
    LogKind,
    ModuleEvent,
    ModuleEventKind,
    ModuleHealth,
    Resource,
    Run,
    RunLog,
    backend_name,
)
from .rows import run_waiting as rows_of_run_waiting
from .validation import one_line

logger = logging.getLogger(__name__)

GAVE_UP = LogKind.CLEANUP_GAVE_UP
RECOVERED = LogKind.CLEANUP_RECOVERED
MODULE_DOWN = ModuleEventKind.DOWN
MODULE_UP = ModuleEventKind.UP
# A backend's dead-man's switch went off: told once per lapse (rule 34).
MODULE_LAPSED = ModuleEventKind.LAPSED
MODULE_EVENTS = (MODULE_DOWN, MODULE_UP, MODULE_LAPSED)
# Bounds: runs told per call, messages sent per call, rows listed in one message.
RUNS_PER_NOTICE = 50
SENDS_PER_DELIVER = 20
# A call to `deliver` starts no new send after this, so slow webhooks cost a task seconds, not minutes.
DELIVER_BUDGET_S = 10
ROWS_PER_MESSAGE = 50
# A sender that died holding a message gives it up after this.
CLAIM_S = 60
BACKOFF_S = 30
MAX_BACKOFF_S = 3600

DUE = (Q(cleanup_status=CleanupStatus.INCOMPLETE) & ~Q(alerted_status=AlertedStatus.GAVE_UP)) | Q(
    cleanup_status=CleanupStatus.COMPLETE, alerted_status__in=[AlertedStatus.GAVE_UP, AlertedStatus.RETRIED]
)


def notice(deliver_now: bool = True) -> int:
    """Tell every transition not yet told (at most ``RUNS_PER_NOTICE``), then send the outbox.

    Answers how many transitions this call claimed. Safe to call from any number of
    workers at once: each transition is claimed by exactly one.
    """
    run_ids = list(Run.objects.filter(DUE).order_by("id").values_list("id", flat=True)[:RUNS_PER_NOTICE])
    told = sum(1 for run_id in run_ids if tell(run_id))
    told += notice_modules()
    if deliver_now:
        deliver()
    return told


def tell(run_id: int) -> str | None:
    """Claim one run's transition and write its log entry and outbox; answers the event or None."""
    with transaction.atomic():
        event: str | None = None
        if (
            Run.objects.filter(pk=run_id, cleanup_status=CleanupStatus.INCOMPLETE)
            .exclude(alerted_status=AlertedStatus.GAVE_UP)
            .update(alerted_status=AlertedStatus.GAVE_UP)
        ):
            event = GAVE_UP
        elif Run.objects.filter(
            pk=run_id,
            cleanup_status=CleanupStatus.COMPLETE,
            alerted_status__in=[AlertedStatus.GAVE_UP, AlertedStatus.RETRIED],
        ).update(alerted_status=AlertedStatus.RECOVERED):
            event = RECOVERED
        if event is None:
            return None  # another worker told it first, or it moved on meanwhile
        run = Run.objects.get(pk=run_id)
        message = describe(run, event)
        RunLog.write(run.pk, event, unresolved=message["unresolved_count"], url=message["url"])
        Alert.objects.bulk_create(
            Alert(run=run, event=event, channel=channel, payload=message) for channel in channels()
        )
    logger.info("run %s: %s", run_id, event, extra=about(run=run_id))
    return event


def channels() -> list[str]:
    found: list[str] = []
    if settings.ADMINS:
        found.append(AlertChannel.MAIL)
    if setting("EVENT_ALERT_WEBHOOK_URL"):
        found.append(AlertChannel.WEBHOOK)
    return found


def nowhere() -> bool:
    """No destination is set: a transition is logged, but nobody is told."""
    return not channels()


def _site(path: str) -> str:
    base: str = setting("EVENT_SITE_URL") or ""
    return base.rstrip("/") + path


def run_url(run_id: int) -> str:
    return _site(reverse("admin:cleanup_run_change", args=[run_id]))


def run_links(run_id: int) -> dict[str, str]:
    """Where a person (the admin) and a console (the API) read the run."""
    return {
        "admin": run_url(run_id),
        "api": _site(reverse("events-run", args=[run_id])),
        "api_resources": _site(reverse("events-run-resources", args=[run_id])),
    }


def describe(run: Run, event: str) -> dict[str, Any]:
    """The message: the run, its unresolved rows with their last errors, and a link to it."""
    unresolved = rows_of_run_waiting(run.pk)
    rows = unresolved.order_by("id")[:ROWS_PER_MESSAGE]
    return {
        "event": event,
        "run": {"id": run.pk, "name": one_line(run.name), "status": run.status, "cleanup_status": run.cleanup_status},
        "unresolved_count": unresolved.count(),
        "unresolved": [
            {
                "id": r.pk,
                "kind": one_line(r.kind),
                "ref": one_line(r.ref),
                "state": r.state,
                "attempts": r.revert_attempts,
                "last_error": one_line(r.last_error),
            }
            for r in rows
        ],
        "url": run_url(run.pk),
        "links": run_links(run.pk),
    }


def deliver(limit: int = SENDS_PER_DELIVER) -> int:
    """Send the messages that are due, each claimed first; answers how many were sent."""
    # Claims and backoffs on the database's clock (`cleanup.clock`): two senders whose
    # clocks disagree never send one message at once.
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=clock.at())
    due = Alert.objects.filter(free, sent_at__isnull=True, next_attempt_at__lte=clock.at())
    sent = 0
    stop_at = time.monotonic() + DELIVER_BUDGET_S
    for alert_id in list(due.order_by("next_attempt_at", "id").values_list("id", flat=True)[:limit]):
        if time.monotonic() > stop_at:
            break  # the rest waits for the next call
        until = clock.now() + timedelta(seconds=CLAIM_S)
        claimed = Alert.objects.filter(free, pk=alert_id, sent_at__isnull=True).update(
            claimed_until=until, attempts=F("attempts") + 1
        )
        if not claimed:
            continue
        alert = Alert.objects.get(pk=alert_id)
        error = send(alert)
        mine = Alert.objects.filter(pk=alert_id, claimed_until=until)
        if error is None:
            accepted = clock.now()
            sent += mine.update(sent_at=accepted, claimed_until=None, last_error="")
            if alert.module_event_id is not None:
                ModuleEvent.objects.filter(pk=alert.module_event_id, told_at__isnull=True).update(told_at=accepted)
        else:
            wait = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (alert.attempts - 1))
            mine.update(claimed_until=None, last_error=error[:2000], next_attempt_at=clock.after(wait))
            logger.warning("alert %s (%s) not delivered, tried again in %s s: %s", alert_id, alert, wait, error)
    return sent


def send(alert: Alert) -> str | None:
    """Send one message; answers None when it was accepted, else why not. Never raises."""
    try:
        if alert.channel == AlertChannel.MAIL:
            subject, body = mail_text(alert.payload)
            mail_admins(subject, body, fail_silently=False)
            return None
        return post_webhook(alert.payload, delivery_id(alert))
    except Exception as exc:  # a mail server or webhook failure is recorded, not raised
        return f"{type(exc).__name__}: {exc}"


# Delivery ids are UUIDs derived from the message itself, so a retry carries the same one.
DELIVERY_NAMESPACE = uuid.UUID("6f0c7c1e-4b1a-4d2e-9a53-2f1f6a0e9b11")


def delivery_id(alert: Alert) -> str:
    """The message's delivery id: unique per message, the same on every retry of it."""
    return str(uuid.uuid5(DELIVERY_NAMESPACE, f"{alert.pk}:{alert.created_at.isoformat()}"))


def signature(secret: str, timestamp: int, body: bytes, delivery: str = "") -> str:
    """``t=<timestamp>,v1=<HMAC of "<timestamp>.<body>">,v2=<HMAC of "<timestamp>.<delivery>.<body>">``
    (hex HMAC-SHA256 under ``secret``); ``body`` is the bytes sent."""
    old = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    new = hmac.new(secret.encode(), f"{timestamp}.{delivery}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={old},v2={new}"


def post_webhook(payload: object, delivery: str | None = None) -> str | None:
    url: str = setting("EVENT_ALERT_WEBHOOK_URL")
    if not url:
        return "EVENT_ALERT_WEBHOOK_URL is not set"
    timeout: float = setting("EVENT_ALERT_WEBHOOK_TIMEOUT_S")
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {"Content-Type": "application/json"}
    if delivery:
        headers["X-Eventsite-Delivery"] = delivery
    secret: str = setting("EVENT_ALERT_WEBHOOK_SECRET")
    if secret:
        headers["X-Eventsite-Signature"] = signature(secret, int(time.time()), body, delivery or "")
    response = httpx.post(url, content=body, headers=headers, timeout=timeout, follow_redirects=False)
    if response.status_code >= 300:
        return f"the webhook answered {response.status_code}"
    return None


def mail_text(message: dict[str, Any]) -> tuple[str, str]:
    if message["event"] in MODULE_EVENTS:
        return module_mail_text(message)
    run = message["run"]
    name = one_line(run["name"])
    if message["event"] == GAVE_UP:
        subject = f'Cleanup of run #{run["id"]} "{name}" gave up: {message["unresolved_count"]} row(s) left'
        lead = "The automatic cleanup has stopped trying. These rows were not given back and wait for a person:"
    else:
        subject = f'Cleanup of run #{run["id"]} "{name}" is complete'
        lead = "Everything the run took is now resolved."
    lines = [lead, ""]
    for row in message["unresolved"]:
        lines.append(
            f"- {one_line(row['kind'])}:{one_line(row['ref'])} ({row['state']}, {row['attempts']} attempt(s)): "
            f"{one_line(row['last_error']) or 'no error recorded'}"
        )
    more = message["unresolved_count"] - len(message["unresolved"])
    if more > 0:
        lines.append(f"- and {more} more")
    lines += ["", f"The run: {message['url']}"]
    return subject, "\n".join(lines)


# -- modules ------------------------------------------------------------------------------


def notice_modules() -> int:
    """Tell every module change not yet told (at most ``RUNS_PER_NOTICE``); answers how many this call claimed."""
    event_ids = list(
        ModuleEvent.objects.filter(alerted_at__isnull=True, kind__in=MODULE_EVENTS)
        .order_by("id")
        .values_list("id", flat=True)[:RUNS_PER_NOTICE]
    )
    return sum(1 for event_id in event_ids if tell_module(event_id))


def tell_module(event_id: int) -> str | None:
    """Claim one module change and write its outbox; answers the event's kind, or None."""
    with transaction.atomic():
        if not ModuleEvent.objects.filter(pk=event_id, alerted_at__isnull=True).update(alerted_at=timezone.now()):
            return None  # another worker told it first
        event = ModuleEvent.objects.get(pk=event_id)
        message = describe_module(event)
        Alert.objects.bulk_create(
            Alert(module=event.module, module_event=event, event=event.kind, channel=channel, payload=message)
            for channel in channels()
        )
    logger.info("module %s: %s", backend_name(event.module, event.backend), event.kind)
    return event.kind


def modules_url() -> str:
    return _site(reverse("admin:cleanup_modulehealth_changelist"))


def module_links() -> dict[str, str]:
    return {"admin": modules_url(), "api": _site(reverse("events-modules"))}


def describe_module(event: ModuleEvent) -> dict[str, Any]:
    """The message: which module, what changed, who changed it, the error, and how much waits on it."""
    detail = event.detail or {}
    mine = {"module": event.module, "backend": event.backend}
    waiting = Resource.objects.filter(**mine, state__in=UNRESOLVED, run__status__in=TERMINAL)
    health = ModuleHealth.objects.filter(**mine).first()
    return {
        "event": event.kind,
        "module": event.module,
        # Which of the module's backends changed ("" for its only one), and how people name it.
        "backend": event.backend,
        "name": backend_name(event.module, event.backend),
        "at": event.at.isoformat(),
        "by": one_line(detail.get("by", "")),
        "error": one_line(detail.get("error") or detail.get("last_error") or ""),
        "down_since": health.down_since.isoformat() if health and health.down_since else None,
        "down_for_s": detail.get("down_for_s"),
        "unresolved_rows": waiting.count(),
        "url": modules_url(),
        "links": module_links(),
    }


def module_mail_text(message: dict[str, Any]) -> tuple[str, str]:
    module = one_line(message.get("name") or message["module"])
    by = one_line(message["by"]) or "the engine"
    if message["event"] == MODULE_LAPSED:
        subject = f"Module {module} gave back by itself: no word from the core"
        lead = (
            f"{one_line(message['error'])}."
            " The rows it gave back are recorded as given back and will not be called again;"
            " runs still running there were aborted."
        )
    elif message["event"] == MODULE_DOWN:
        subject = f"Module {module} is down: its work waits"
        error = one_line(message["error"]) or "no error recorded"
        lead = (
            f"{module} was marked down by {by}: {error}."
            " Its rows and steps are not attempted, and spend no attempts, until it answers again."
        )
    else:
        minutes = f" after {round(message['down_for_s'] / 60)} min" if message.get("down_for_s") else ""
        subject = f"Module {module} is up again"
        lead = (
            f"{module} was marked up by {by}{minutes}; its waiting work resumes."
            f" The last error was: {one_line(message['error']) or 'none'}."
        )
    lines = [
        lead,
        "",
        f"Unresolved rows of ended runs on {module}: {message['unresolved_rows']}",
        "",
        f"Module health: {message['url']}",
    ]
    return subject, "\n".join(lines)
