"""Signed webhooks (issue 19, item 8): with EVENT_ALERT_WEBHOOK_SECRET each delivery carries
its id (the same on a retry) and a signature that docs/api.md's own recipe verifies; the
body links to the API beside the admin."""

import json
import re
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone

from cleanup import alerts
from cleanup.models import Alert
from cleanup.tasks import sweep_task
from tests.test_alerts import giving_up  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
SECRET = "whsec-test-0123456789"


def documented(name="verify"):
    """A name of docs/api.md's webhook recipe (`verify`, `Receiver`), as a receiver would paste it."""
    section = API_DOC.read_text().split("## Webhooks", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {}
    exec(compile(code, str(API_DOC), "exec"), namespace)
    return namespace[name]


def documented_verify():
    return documented("verify")


class Receiver:
    """A webhook on a loopback port keeping each delivery's headers and raw body; it answers
    the statuses in ``answers`` in turn, then 204."""

    def __init__(self, answers=()):
        self.deliveries = []
        self.answers = list(answers)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.deliveries.append((dict(self.headers), body))
                self.send_response(receiver.answers.pop(0) if receiver.answers else 204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flaky_receiver():
    receiver = Receiver(answers=[500])
    yield receiver
    receiver.stop()


def test_a_signed_delivery_verifies_with_the_documented_recipe_and_a_retry_keeps_its_id(
    giving_up,  # noqa: F811
    flaky_receiver,
    settings,
):
    run, _ = giving_up
    settings.ADMINS = []
    settings.EVENT_ALERT_WEBHOOK_URL = flaky_receiver.url
    settings.EVENT_ALERT_WEBHOOK_SECRET = SECRET
    verify = documented_verify()

    sweep_task()  # gives up; the first delivery answers 500
    assert len(flaky_receiver.deliveries) == 1
    with time_machine.travel(timezone.now() + timedelta(minutes=5), tick=False):
        assert alerts.deliver() == 1  # the retry is accepted
    (first, first_body), (retry, retry_body) = flaky_receiver.deliveries

    assert first["X-Eventsite-Delivery"] == retry["X-Eventsite-Delivery"], "a retry took another delivery id"
    assert re.fullmatch(r"[0-9a-f-]{36}", retry["X-Eventsite-Delivery"])
    assert verify(SECRET, first, first_body)
    assert not verify("another-secret", first, first_body), "any key verifies"
    assert not verify(SECRET, first, first_body + b" "), "a changed body verifies"
    assert not verify(
        SECRET, {**first, "X-Eventsite-Signature": first["X-Eventsite-Signature"].replace("t=", "t=1")}, first_body
    )

    body = json.loads(retry_body)
    base = "https://events.example.com"
    assert body["links"] == {
        "admin": f"{base}/admin/cleanup/run/{run.pk}/change/",
        "api": f"{base}/api/v1/events/runs/{run.pk}/",
        "api_resources": f"{base}/api/v1/events/runs/{run.pk}/resources/",
    }
    assert Alert.objects.get().sent_at is not None


def test_an_unsigned_site_sends_no_signature_but_still_a_delivery_id(giving_up, flaky_receiver, settings):  # noqa: F811
    settings.ADMINS = []
    settings.EVENT_ALERT_WEBHOOK_URL = flaky_receiver.url
    flaky_receiver.answers.clear()
    sweep_task()
    [(headers, _body)] = flaky_receiver.deliveries
    assert "X-Eventsite-Signature" not in headers
    assert headers["X-Eventsite-Delivery"]


def test_two_messages_have_two_delivery_ids():
    now = timezone.now()
    one = Alert.objects.create(event="module.down", channel="webhook", module="test", created_at=now)
    two = Alert.objects.create(event="module.up", channel="webhook", module="test", created_at=now)
    assert alerts.delivery_id(one) != alerts.delivery_id(two)
    assert alerts.delivery_id(one) == alerts.delivery_id(Alert.objects.get(pk=one.pk))


def test_a_replayed_delivery_is_refused_under_a_new_id_and_handled_once_under_its_own(
    giving_up,  # noqa: F811
    settings,
):
    """A captured alert sent again within the tolerance: under a new delivery id its
    signature does not verify; under its own id the documented receiver handles it once."""
    receiver = Receiver()
    try:
        settings.ADMINS = []
        settings.EVENT_ALERT_WEBHOOK_URL = receiver.url
        settings.EVENT_ALERT_WEBHOOK_SECRET = SECRET
        sweep_task()
        [(captured, body)] = receiver.deliveries
    finally:
        receiver.stop()
    verify = documented_verify()
    assert verify(SECRET, captured, body)
    replayed = {**captured, "X-Eventsite-Delivery": "7b0ed7a5-34c5-4d52-9d47-3e1e1c1a0b5e"}
    assert not verify(SECRET, replayed, body), "a new delivery id passed the signature"

    handled = []
    console = documented("Receiver")(SECRET, handled.append)
    assert [console.receive(captured, body) for _ in range(3)] == [204, 204, 204]
    assert handled == [body], "the same delivery handled more than once"
    assert console.receive(replayed, body) == 401
    assert handled == [body]
