"""Staff are told once when a run's cleanup gives up, and once when it later completes.

By mail to ADMINS (Django's locmem backend) and by a JSON POST to a real HTTP server on
a loopback port; a dead or slow webhook never stops the sweep and is tried again later.
"""

import json
import socket
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import time_machine
from django.core import mail
from django.utils import timezone

from cleanup import alerts, registry
from cleanup.manual import request_cleanup
from cleanup.models import Alert, Resource, Run, RunStatus
from cleanup.tasks import sweep_task
from tests.fakes import FakeAction, Scripted, log_kinds, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

ADMINS = [("Ops", "ops@example.com")]


class Receiver:
    """A webhook on a loopback port: records each JSON body; ``delay`` makes it slow."""

    def __init__(self):
        self.bodies = []
        self.delay = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.delay:
                    time.sleep(receiver.delay)  # the caller has given up by now: not delivered
                    return
                receiver.bodies.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


def dead_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"  # nothing listens there any more


@pytest.fixture
def giving_up(settings):
    """A run whose shard refuses every revert: its sweep ends `incomplete` after the ceiling."""
    settings.EVENT_REVERT_BACKOFF_S = 0
    settings.EVENT_REVERT_MAX_ATTEMPTS = 1
    settings.ADMINS = ADMINS
    settings.EVENT_SITE_URL = "https://events.example.com"
    revert = Scripted({"ok": False, "error": "the shard is down (503)", "retry": True})
    registry.register_action(FakeAction(revert=revert))
    run = make_run(status=RunStatus.ABORTED, name="wolf hunt")
    make_rows(make_step(run), ["wolf-1", "wolf-2"])
    return run, revert


def test_it_tells_staff_once_by_mail_and_webhook_when_cleanup_gives_up(giving_up, receiver, settings):
    run, _ = giving_up
    settings.EVENT_ALERT_WEBHOOK_URL = receiver.url

    sweep_task()
    sweep_task()
    alerts.notice()

    run.refresh_from_db()
    assert run.cleanup_status == "incomplete"
    assert log_kinds(run).count("cleanup.gave_up") == 1
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["ops@example.com"]
    assert f"run #{run.pk}" in message.subject and "gave up" in message.subject
    assert "wolf-1" in message.body and "the shard is down (503)" in message.body
    assert f"https://events.example.com/admin/cleanup/run/{run.pk}/change/" in message.body
    assert len(receiver.bodies) == 1
    body = receiver.bodies[0]
    assert (body["event"], body["run"]["id"], body["run"]["name"]) == ("cleanup.gave_up", run.pk, "wolf hunt")
    assert {r["ref"] for r in body["unresolved"]} >= {"wolf-1", "wolf-2"}
    assert {r["last_error"] for r in body["unresolved"] if r["kind"] != "step"} == {"the shard is down (503)"}
    assert body["url"] == f"https://events.example.com/admin/cleanup/run/{run.pk}/change/"


def test_it_tells_staff_again_when_the_cleanup_later_completes(
    giving_up, receiver, settings, django_capture_on_commit_callbacks
):
    run, revert = giving_up
    settings.EVENT_ALERT_WEBHOOK_URL = receiver.url
    sweep_task()
    revert.answers = [{"ok": True, "failed": []}]

    with django_capture_on_commit_callbacks(execute=True):
        request_cleanup(run, "alice")
    alerts.notice()

    run.refresh_from_db()
    assert run.cleanup_status == "complete"
    assert log_kinds(run).count("cleanup.recovered") == 1
    assert [m.subject.split(" is ")[-1] for m in mail.outbox][-1] == "complete"
    assert [b["event"] for b in receiver.bodies] == ["cleanup.gave_up", "cleanup.recovered"]
    assert len(mail.outbox) == 2


def test_a_run_that_gives_up_again_after_a_persons_retry_is_told_again(
    giving_up, settings, django_capture_on_commit_callbacks
):
    run, _ = giving_up
    sweep_task()
    with django_capture_on_commit_callbacks(execute=True):
        request_cleanup(run, "alice")
    alerts.notice()
    assert log_kinds(run).count("cleanup.gave_up") == 2
    assert len(mail.outbox) == 2


def test_a_run_whose_cleanup_simply_completes_tells_nobody(settings):
    settings.ADMINS = ADMINS
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = make_run(status=RunStatus.COMPLETED)
    make_rows(make_step(run), ["orc-1"])
    sweep_task()
    run.refresh_from_db()
    assert run.cleanup_status == "complete"
    assert "cleanup.gave_up" not in log_kinds(run) and "cleanup.recovered" not in log_kinds(run)
    assert mail.outbox == [] and not Alert.objects.exists()


@pytest.mark.parametrize("kind", ["dead", pytest.param("slow", marks=pytest.mark.slow)])
def test_a_dead_or_slow_webhook_does_not_stop_the_sweep_and_is_tried_again_later(giving_up, receiver, settings, kind):
    run, _ = giving_up
    other = make_run(status=RunStatus.COMPLETED, name="second")
    make_rows(make_step(other), ["wolf-9"])
    settings.EVENT_ALERT_WEBHOOK_TIMEOUT_S = 1
    if kind == "dead":
        settings.EVENT_ALERT_WEBHOOK_URL = dead_url()
    else:
        settings.EVENT_ALERT_WEBHOOK_URL = receiver.url
        receiver.delay = 3

    started = time.monotonic()
    sweep_task()
    spent = time.monotonic() - started

    assert spent < 10, "the webhook held the sweep for longer than its timeouts"
    assert set(Run.objects.values_list("cleanup_status", flat=True)) == {"incomplete"}
    assert len(mail.outbox) == 2, "the mail did not go because the webhook failed"
    hooks = Alert.objects.filter(channel="webhook")
    assert hooks.count() == 2 and all(a.sent_at is None and a.last_error for a in hooks)
    assert all(a.next_attempt_at > timezone.now() for a in hooks)

    receiver.delay = 0
    settings.EVENT_ALERT_WEBHOOK_URL = receiver.url
    alerts.notice()
    assert Alert.objects.filter(sent_at__isnull=False, channel="webhook").count() == 0, "retried before its backoff"
    before = len(receiver.bodies)
    with time_machine.travel(timezone.now() + timedelta(minutes=5)):
        alerts.notice()
        alerts.notice()
    assert hooks.filter(sent_at__isnull=False).count() == 2
    assert len(receiver.bodies) - before == 2
    assert {b["run"]["id"] for b in receiver.bodies[before:]} == {run.pk, other.pk}
    assert len(mail.outbox) == 2


def test_a_transition_is_told_once_by_whichever_notice_claims_it(giving_up):
    run, _ = giving_up
    sweep_task()
    Run.objects.filter(pk=run.pk).update(alerted_status="")  # as if nobody had told it yet
    Alert.objects.all().delete()
    mail.outbox.clear()

    assert alerts.tell(run.pk) == "cleanup.gave_up"
    assert alerts.tell(run.pk) is None
    alerts.deliver()
    alerts.deliver()
    assert len(mail.outbox) == 1


@pytest.mark.django_db(transaction=True)
def test_several_sweepers_tell_one_transition_once(settings):

    settings.ADMINS = ADMINS
    run = make_run(status=RunStatus.ABORTED, name="raced")
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.update(state="failed", revert_attempts=3)
    Run.objects.filter(pk=run.pk).update(cleanup_status="incomplete")
    barrier = threading.Barrier(4)
    told = []

    def sweeper():
        from django.db import connections

        try:
            barrier.wait()
            told.append(alerts.notice(deliver_now=False))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweeper) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(told) == [0, 0, 0, 1]
    assert log_kinds(run).count("cleanup.gave_up") == 1
    assert Alert.objects.count() == 1


def test_staff_can_read_the_outbox_in_the_admin(client, giving_up, settings):
    from django.contrib.auth.models import User
    from django.urls import reverse

    settings.EVENT_ALERT_WEBHOOK_URL = dead_url()
    sweep_task()
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    page = client.get(reverse("admin:cleanup_alert_changelist")).content.decode()
    assert "cleanup.gave_up" in page and "not yet" in page and "ConnectError" in page


@pytest.mark.parametrize("command", ["sweep", "tick"])
def test_the_sweep_and_tick_commands_tell_staff_too(giving_up, command):
    """A site that runs the commands from cron, with no cluster, is told all the same."""
    import io

    from django.core.management import call_command

    run, _ = giving_up
    call_command(command, stdout=io.StringIO())

    run.refresh_from_db()
    assert run.cleanup_status == "incomplete"
    assert len(mail.outbox) == 1 and f"run #{run.pk}" in mail.outbox[0].subject
