"""Safe retries: a POST with an Idempotency-Key does its work once, and its retries get the first answer."""

import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from cleanup import runner
from cleanup.api import idempotency
from cleanup.api.tokens import issue
from cleanup.models import IdempotencyKey, Resource, Run, RunLog, RunStatus
from tests.fakes import make_run
from tests.test_api_access import API, api_as, ended_run, user_with  # noqa: F401 (ended_run: a fixture)

pytestmark = pytest.mark.django_db

START = {"name": "raid", "steps": [{"action": "core.wait", "params": {"seconds": 600}}]}


@pytest.fixture
def api():
    return api_as("view_run", "add_run", "change_run", "cleanup_run", "view_resource", "view_runlog")


def post(client, path, body, key=None):
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(path, body, format="json", **headers)


def code_of(response):
    """The error's code: the envelope's ``code``, else the code DRF gave the detail."""
    body = response.json()
    if "code" in body:
        return body["code"]
    return response.data["detail"].code


def test_a_start_retried_with_its_key_makes_one_run_and_answers_the_first_answer_again(api):
    first = post(api, f"{API}runs/", START, key="start-raid-1")
    assert first.status_code == 201
    retries = [post(api, f"{API}runs/", START, key="start-raid-1") for _ in range(2)]

    assert Run.objects.count() == 1
    for retry in retries:
        assert retry.status_code == 201
        assert retry.json() == first.json()
        assert retry["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first


def test_without_a_key_each_start_is_a_new_run(api):
    assert post(api, f"{API}runs/", START).status_code == 201
    assert post(api, f"{API}runs/", START).status_code == 201
    assert Run.objects.count() == 2


def test_the_same_body_written_otherwise_is_the_same_request(api):
    post(api, f"{API}runs/", START, key="k")
    reordered = api.post(
        f"{API}runs/",
        '{ "steps": [{"params": {"seconds": 600}, "action": "core.wait"}], "name": "raid" }',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert reordered.status_code == 201 and reordered["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1


def test_the_key_with_another_body_or_endpoint_is_refused_422_and_does_nothing(api, ended_run):  # noqa: F811
    post(api, f"{API}runs/", START, key="k")
    other_body = post(api, f"{API}runs/", {**START, "name": "another raid"}, key="k")
    other_path = post(api, f"{API}runs/{ended_run.pk}/cleanup/", {}, key="k")

    for response in (other_body, other_path):
        assert response.status_code == 422
        assert code_of(response) == "idempotency_key_reused"
        assert "Idempotent-Replayed" not in response
    assert list(Run.objects.values_list("name", flat=True).order_by("id")) == ["broken raid", "raid"]
    assert not RunLog.objects.filter(kind="cleanup.retry").exists()


def test_keys_are_each_users_own(api):
    other = api_as("add_run", "view_run", username="other-console")
    assert post(api, f"{API}runs/", START, key="shared").status_code == 201
    second = post(other, f"{API}runs/", START, key="shared")
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    assert Run.objects.count() == 2


def test_a_retried_cancel_answers_the_first_answer_not_409(api):
    running = make_run(status=RunStatus.RUNNING, name="festival")
    first = post(api, f"{API}runs/{running.pk}/cancel/", {"cleanup": False}, key="cancel-7")
    retry = post(api, f"{API}runs/{running.pk}/cancel/", {"cleanup": False}, key="cancel-7")
    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json() and retry["Idempotent-Replayed"] == "true"
    # Without the key, the same cancel sent again is refused: the run has ended.
    assert post(api, f"{API}runs/{running.pk}/cancel/", {"cleanup": False}).status_code == 409
    assert RunLog.objects.filter(run=running, kind="run.cancelled").count() == 1


def test_a_retried_cleanup_queues_one_pass_and_logs_one_retry(api, ended_run):  # noqa: F811
    answers = [post(api, f"{API}runs/{ended_run.pk}/cleanup/", {}, key="clean-1") for _ in range(3)]
    assert {a.status_code for a in answers} == {202}
    assert RunLog.objects.filter(run=ended_run, kind="cleanup.retry").count() == 1
    assert answers[1].json() == answers[0].json()
    assert answers[1]["Location"] == answers[0]["Location"]


def test_a_retried_waive_answers_the_first_answer(api, ended_run):  # noqa: F811
    row = Resource.objects.get()
    first = post(api, f"{API}resources/{row.pk}/waive/", {"reason": "gone by hand"}, key="w")
    retry = post(api, f"{API}resources/{row.pk}/waive/", {"reason": "gone by hand"}, key="w")
    assert first.status_code == retry.status_code == 200 and retry.json() == first.json()
    assert RunLog.objects.filter(kind="resource.waived").count() == 1


def test_a_refusal_is_replayed_too(api):
    """A 4xx the endpoint answered is the first answer: the retry is not tried again."""
    bad = {"name": "raid", "steps": [{"action": "no.such.action"}]}
    first = post(api, f"{API}runs/", bad, key="bad")
    retry = post(api, f"{API}runs/", bad, key="bad")
    assert first.status_code == retry.status_code == 400
    assert retry.json() == first.json() and retry["Idempotent-Replayed"] == "true"


def test_a_key_longer_than_255_characters_or_empty_is_refused_400_naming_the_header(api):
    for key in ("k" * 256, " "):
        response = post(api, f"{API}runs/", START, key=key)
        assert response.status_code == 400, key
        assert "Idempotency-Key" in str(response.json())
    assert Run.objects.count() == 0
    assert post(api, f"{API}runs/", START, key="k" * 255).status_code == 201


def test_a_utf8_key_is_refused_as_past_ascii_and_a_control_character_as_one(api):
    # The test client, like a WSGI server, hands a header's bytes over as ISO-8859-1.
    utf8 = "clé-1".encode().decode("latin-1")  # "é" is 0xC3 0xA9: two characters past ASCII
    response = post(api, f"{API}runs/", START, key=utf8)
    assert response.status_code == 400
    [message] = response.json()["errors"]["Idempotency-Key"]
    assert "printable ASCII" in message and "byte 2 is past ASCII" in message and "control" not in message
    # "ń" is 0xC5 0x84: its second byte reads as a C1 control, yet the key is named as past ASCII.
    response = post(api, f"{API}runs/", START, key="ń".encode().decode("latin-1"))
    assert "byte 0 is past ASCII" in response.json()["errors"]["Idempotency-Key"][0]
    response = post(api, f"{API}runs/", START, key="a\x01b")
    assert "byte 1 is a control character" in response.json()["errors"]["Idempotency-Key"][0]
    assert Run.objects.count() == 0
    assert post(api, f"{API}runs/", START, key="3f2c8e1a-0d4b-4c1e-9a57-7f3b2d9e6c10").status_code == 201


def test_a_request_that_failed_with_a_server_error_lets_its_key_go(api, monkeypatch):
    real = runner.start_run
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the database went away")
        return real(*args, **kwargs)

    monkeypatch.setattr("cleanup.api.views.start_run", fails_once)
    client = api
    client.raise_request_exception = False
    assert post(client, f"{API}runs/", START, key="k").status_code == 500
    assert not IdempotencyKey.objects.exists()
    retry = post(client, f"{API}runs/", START, key="k")
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert Run.objects.count() == 1


def test_a_key_held_by_a_request_that_died_is_taken_over_once_its_hold_ends(api):
    post(api, f"{API}runs/", START, key="k")
    # As if the request that held it had been killed before it answered.
    Run.objects.all().delete()
    IdempotencyKey.objects.update(status=None, body="", locked_until=timezone.now() - timedelta(seconds=1))
    retry = post(api, f"{API}runs/", START, key="k")
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert Run.objects.count() == 1
    assert post(api, f"{API}runs/", START, key="k")["Idempotent-Replayed"] == "true"


def test_a_retry_while_the_first_still_works_waits_then_answers_409_in_use(api, monkeypatch):
    post(api, f"{API}runs/", START, key="k")
    IdempotencyKey.objects.update(status=None, locked_until=timezone.now() + timedelta(seconds=60))
    monkeypatch.setattr(idempotency, "WAIT_S", 0.2)
    response = post(api, f"{API}runs/", START, key="k")
    assert response.status_code == 409
    assert code_of(response) == "idempotency_key_in_use"
    assert response["Retry-After"] == "1"
    assert Run.objects.count() == 1


@override_settings(EVENT_IDEMPOTENCY_TTL_S=3600)
def test_a_key_past_its_time_to_live_does_the_work_again_and_the_tick_prunes_expired_keys(api):
    post(api, f"{API}runs/", START, key="k")
    post(api, f"{API}runs/", START, key="old")
    with time_machine.travel(timezone.now() + timedelta(seconds=3601), tick=False):
        again = post(api, f"{API}runs/", START, key="k")
        assert again.status_code == 201 and "Idempotent-Replayed" not in again
        assert Run.objects.count() == 3
        runner.tick(by="test")
        assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["k"]


def test_pruning_is_bounded_per_call():
    owner = user_with("add_run")
    past = timezone.now() - timedelta(seconds=1)
    for n in range(5):
        IdempotencyKey.objects.create(
            user=owner, key=f"k{n}", fingerprint="f", token="00000000-0000-0000-0000-000000000000",
            locked_until=past, expires_at=past,
        )  # fmt: skip
    assert IdempotencyKey.objects.prune(limit=3) == 3
    assert IdempotencyKey.objects.count() == 2


def test_the_schema_offers_the_header_and_its_answers_on_every_post(api):
    admin = APIClient()
    admin.force_authenticate(user_with(username="schema"))
    schema = admin.get("/api/schema/?format=json").json()
    posts = {path: ops["post"] for path, ops in schema["paths"].items() if "post" in ops}
    assert len(posts) >= 8
    for path, operation in posts.items():
        headers = [p["name"] for p in operation["parameters"] if p["in"] == "header"]
        assert "Idempotency-Key" in headers, path
        assert {"409", "422"} <= set(operation["responses"]), path
        answers = [a for code, a in operation["responses"].items() if code.startswith("2")]
        assert answers and all("Idempotent-Replayed" in a["headers"] for a in answers), path


# -- on PostgreSQL: retries that arrive together -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_ten_parallel_starts_with_one_key_make_one_run_and_all_answer_it(monkeypatch):
    _row, token = issue(user_with("add_run", "view_run"))
    real = runner.start_run

    def slow_start(*args, **kwargs):
        # The first request is still working when the others arrive.
        threading.Event().wait(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr("cleanup.api.views.start_run", slow_start)
    barrier = threading.Barrier(10)
    answers = []

    def one():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        try:
            barrier.wait()
            answers.append(post(client, f"{API}runs/", START, key="parallel"))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert Run.objects.count() == 1
    assert [a.status_code for a in answers] == [201] * 10
    assert len({a.content for a in answers}) == 1
    assert sorted(a.get("Idempotent-Replayed", "") for a in answers) == [""] + ["true"] * 9
