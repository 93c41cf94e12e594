"""Rates and quotas: each user's reads, writes and actions throttled, and the runs running at
once bounded in all and per user; each answered 429 with its code and Retry-After."""

import threading
import time

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from cleanup import runner
from cleanup.api import throttles
from cleanup.models import IdempotencyKey, Run, RunStatus
from eventsite.settings import env_rate
from tests.fakes import make_run
from tests.test_api_access import API, api_as, ended_run, user_with  # noqa: F401 (ended_run: a fixture)
from tests.test_api_idempotency import START, code_of

pytestmark = pytest.mark.django_db

EVERY = ("view_run", "add_run", "change_run", "cleanup_run", "view_resource", "view_runlog")


def rates(reads="1000/min", writes="1000/min", actions="1000/min"):
    rest = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"events_reads": reads, "events_writes": writes, "events_actions": actions},
    }
    return override_settings(REST_FRAMEWORK=rest)


@pytest.fixture(autouse=True)
def fresh_counts():
    for alias in ("default", throttles.CACHE):
        caches[alias].clear()
    yield
    for alias in ("default", throttles.CACHE):
        caches[alias].clear()


def test_a_users_reads_past_the_rate_answer_429_throttled_with_retry_after():
    one, other = api_as(*EVERY, username="one"), api_as(*EVERY, username="other")
    with rates(reads="3/min"):
        assert [one.get(f"{API}runs/").status_code for _ in range(3)] == [200] * 3
        refused = one.get(f"{API}summary/")
        assert refused.status_code == 429
        assert code_of(refused) == "throttled"
        assert 0 < int(refused["Retry-After"]) <= 60
        # Each user has their own count.
        assert other.get(f"{API}runs/").status_code == 200


def test_the_counts_are_kept_in_the_throttles_own_cache():
    api = api_as(*EVERY)
    with rates(reads="2/min"):
        api.get(f"{API}runs/")
        api.get(f"{API}runs/")
        assert api.get(f"{API}runs/").status_code == 429
        # The site's throttle cache holds them (Redis when REDIS_URL is set): emptied, the user may read again.
        caches[throttles.CACHE].clear()
        assert api.get(f"{API}runs/").status_code == 200


def test_a_throttle_whose_cache_fails_lets_the_request_through(monkeypatch):
    class Broken:
        def get(self, *args, **kwargs):
            raise ConnectionError("redis is not answering")

        set = get

    monkeypatch.setattr(throttles, "counts", Broken)
    api = api_as(*EVERY)
    with rates(reads="1/min"):
        assert [api.get(f"{API}runs/").status_code for _ in range(3)] == [200] * 3


def test_a_persons_actions_have_their_own_rate_apart_from_writes(ended_run):  # noqa: F811
    api = api_as(*EVERY)
    running = [make_run(status=RunStatus.RUNNING, name=f"raid {n}") for n in range(2)]
    with rates(writes="5/min", actions="2/min"):
        assert api.post(f"{API}runs/{ended_run.pk}/cleanup/", {}, format="json").status_code == 202
        assert api.post(f"{API}modules/test/reconcile/", {}, format="json").status_code == 202
        refused = api.post(f"{API}runs/{ended_run.pk}/cleanup/", {}, format="json")
        assert refused.status_code == 429 and code_of(refused) == "throttled"
        assert "Retry-After" in refused
        # Cancelling is a write, not an action: it is still allowed, and so are reads.
        assert api.post(f"{API}runs/{running[0].pk}/cancel/", {}, format="json").status_code == 200
        assert api.get(f"{API}runs/").status_code == 200
    assert ended_run.log.filter(kind="cleanup.retry").count() == 1


def test_a_throttled_post_holds_no_idempotency_key():
    api = api_as(*EVERY)
    with rates(writes="1/min"):
        api.post(f"{API}runs/", START, format="json")
        refused = api.post(f"{API}runs/", START, format="json", HTTP_IDEMPOTENCY_KEY="k")
        assert refused.status_code == 429
    assert not IdempotencyKey.objects.exists()


@override_settings(EVENT_MAX_RUNNING_RUNS=2)
def test_a_start_past_the_running_runs_quota_is_429_quota_exceeded_until_one_ends():
    api = api_as(*EVERY)
    assert [api.post(f"{API}runs/", START, format="json").status_code for _ in range(2)] == [201, 201]
    refused = api.post(f"{API}runs/", START, format="json", HTTP_IDEMPOTENCY_KEY="third")
    assert refused.status_code == 429
    assert code_of(refused) == "quota_exceeded"
    assert refused["Retry-After"] == str(runner.RunQuotaExceeded.retry_after_s)
    assert "EVENT_MAX_RUNNING_RUNS" in refused.json()["detail"]
    assert Run.objects.count() == 2
    # A run ends: the same start, retried with its key, is done now (a 429 is not replayed).
    runner.cancel_run(Run.objects.order_by("id").first().pk, cleanup=False)
    retry = api.post(f"{API}runs/", START, format="json", HTTP_IDEMPOTENCY_KEY="third")
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert Run.objects.filter(status=RunStatus.RUNNING).count() == 2


@override_settings(EVENT_MAX_RUNNING_RUNS_PER_USER=1)
def test_the_per_user_quota_counts_each_users_own_running_runs():
    one, other = api_as(*EVERY, username="one"), api_as(*EVERY, username="other")
    assert one.post(f"{API}runs/", START, format="json").status_code == 201
    refused = one.post(f"{API}runs/", START, format="json")
    assert refused.status_code == 429 and code_of(refused) == "quota_exceeded"
    assert "EVENT_MAX_RUNNING_RUNS_PER_USER" in refused.json()["detail"]
    assert other.post(f"{API}runs/", START, format="json").status_code == 201
    assert sorted(Run.objects.values_list("started_by", flat=True)) == ["one", "other"]


@override_settings(EVENT_MAX_RUNNING_RUNS=1)
def test_the_quota_holds_for_the_command_too():
    make_run(status=RunStatus.RUNNING, name="already running")
    steps = '[{"action": "core.wait", "params": {"seconds": 60}}]'
    with pytest.raises(CommandError, match="EVENT_MAX_RUNNING_RUNS"):
        call_command("start_run", "--name", "raid", "--steps", steps)
    assert Run.objects.count() == 1


def test_the_schema_lists_429_on_every_operation():
    admin = APIClient()
    admin.force_authenticate(user_with(username="schema"))
    schema = admin.get("/api/schema/?format=json").json()
    operations = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    assert len(operations) > 15
    assert [(path, method) for path, method, op in operations if "429" not in op["responses"]] == []


def test_a_rate_in_the_environment_is_checked(monkeypatch):
    for value, expected in (("120/min", "120/min"), ("5/s", "5/s"), ("off", None), ("", None)):
        monkeypatch.setenv("API_THROTTLE_READS", value)
        assert env_rate("API_THROTTLE_READS", "1/min") == expected
    for bad in ("120", "0/min", "lots/min", "5/week"):
        monkeypatch.setenv("API_THROTTLE_READS", bad)
        with pytest.raises(ImproperlyConfigured, match="API_THROTTLE_READS"):
            env_rate("API_THROTTLE_READS", "1/min")


# -- on PostgreSQL: starts that arrive together ---------------------------------------------


@pytest.mark.django_db(transaction=True)
@override_settings(EVENT_MAX_RUNNING_RUNS=3)
def test_parallel_starts_at_the_quotas_edge_never_pass_it(monkeypatch):
    real = runner._count_running

    def slow_count(actor):
        counted = real(actor)
        time.sleep(0.3)  # every start has counted before any has stored its run, without the lock
        return counted

    monkeypatch.setattr(runner, "_count_running", slow_count)
    barrier = threading.Barrier(8)
    outcomes = []

    def one(n):
        try:
            barrier.wait()
            runner.start_run(f"raid {n}", [{"action": "core.wait", "params": {"seconds": 60}}])
            outcomes.append("started")
        except runner.RunQuotaExceeded:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["refused"] * 5 + ["started"] * 3
    assert Run.objects.filter(status=RunStatus.RUNNING).count() == 3


def test_every_counted_answer_says_the_users_standing_in_ratelimit_headers():
    api = api_as(*EVERY, "view_moduleevent")
    with rates(reads="3/min"):
        first = api.get(f"{API}runs/")
        assert first.status_code == 200
        assert (first["RateLimit-Limit"], first["RateLimit-Remaining"]) == ("3", "2")
        assert 0 < int(first["RateLimit-Reset"]) <= 60
        assert first["RateLimit-Policy"] == "3;w=60"
        # A 404 counts, and says so; the change feed's answers too.
        assert api.get(f"{API}runs/999999/")["RateLimit-Remaining"] == "1"
        feed = api.get(f"{API}changes/")
        assert feed.status_code == 200 and feed["RateLimit-Remaining"] == "0"
        refused = api.get(f"{API}summary/")
        assert refused.status_code == 429
        assert (refused["RateLimit-Limit"], refused["RateLimit-Remaining"]) == ("3", "0")
        assert 0 < int(refused["RateLimit-Reset"]) <= 60


def test_a_write_answers_the_writes_scope_standing():
    api = api_as(*EVERY)
    with rates(writes="7/min"):
        answer = api.post(f"{API}runs/", {"name": "raid", "steps": []}, format="json")
        assert answer["RateLimit-Limit"] == "7" and answer["RateLimit-Remaining"] == "6"
