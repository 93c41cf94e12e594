"""Bounded work per request (issue 20, item 1): a run's live plan reads at most
EVENT_LIVE_READS_PER_REQUEST values, concurrently, within EVENT_LIVE_READ_BUDGET_S, in the API
and the admin alike, and says which values it did not read."""

import threading
import time

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from cleanup import registry
from cleanup.models import LEASE_KIND, Resource, RunStatus
from cleanup.plan import read_live_many
from tests.fakes import FakeLease, make_run
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db

API = "/api/events/"
LEASES = 1000
# The plan is paged by group; its largest page holds half the leases, each its own group.
PAGE = 500


class SlowShard(FakeLease):
    """A lease whose every read takes ``delay`` seconds, or hangs until released; reads are counted."""

    def __init__(self, delay=0.04, hang=False, **kwargs):
        super().__init__(**kwargs)
        self.delay, self.hang = delay, hang
        self.reads = 0
        self.in_flight = self.most_at_once = 0
        self.lock = threading.Lock()
        self.released = threading.Event()

    def read(self, *, target):
        with self.lock:
            self.reads += 1
            self.in_flight += 1
            self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            if self.hang:
                self.released.wait(30)
            else:
                time.sleep(self.delay)
            return {"ok": True, "value": 5}
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def shard():
    lease = SlowShard()
    registry.register_lease(lease)
    yield lease
    lease.released.set()


@pytest.fixture
def big_run():
    """An ended run holding 1,000 leases on one shard, none handed down."""
    run = make_run(status=RunStatus.COMPLETED, name="festival", cleanup_status="incomplete")
    Resource.objects.bulk_create(
        Resource(
            run=run,
            module="test",
            kind=LEASE_KIND,
            ref=registry.lease_ref("test.rate", f"camp-{i}"),
            action="core.lease",
            payload={"baseline": 1, "applied": 5},
        )
        for i in range(LEASES)
    )
    return run


def lease_entries(groups):
    return [row for group in groups for row in group["rows"] if "lease" in row]


def test_the_api_live_plan_of_a_thousand_leases_reads_at_most_the_cap_concurrently_within_the_budget(shard, big_run):
    client = api_as("view_run", "view_resource")
    started = time.monotonic()
    response = client.get(f"{API}runs/{big_run.pk}/cleanup-plan/?live=1&page_size=500")
    took = time.monotonic() - started

    assert response.status_code == 200
    body = response.json()
    entries = lease_entries(body["groups"])
    assert len(entries) == PAGE
    read = [e for e in entries if "value" in e["lease"]["live"]]
    unread = [e for e in entries if "unread" in e["lease"]["live"]]
    assert shard.reads == 50 and len(read) == 50
    assert len(unread) == PAGE - 50
    assert sorted(body["unread"]) == sorted(e["id"] for e in unread)
    assert "EVENT_LIVE_READS_PER_REQUEST" in unread[0]["lease"]["live"]["unread"]
    # 50 reads of 40 ms one after another would take 2 s; concurrently, 8 at a time, well under.
    assert shard.most_at_once > 1
    assert took < 3 + 2  # EVENT_LIVE_READ_BUDGET_S (3) and generous slack


@override_settings(EVENT_LIVE_READ_BUDGET_S=1)
def test_a_hanging_shard_costs_the_api_plan_its_budget_and_no_more(big_run):
    hung = SlowShard(hang=True)
    registry.register_lease(hung)
    client = api_as("view_run", "view_resource")
    try:
        started = time.monotonic()
        response = client.get(f"{API}runs/{big_run.pk}/cleanup-plan/?live=1&page_size=500")
        took = time.monotonic() - started
    finally:
        hung.released.set()

    assert response.status_code == 200
    body = response.json()
    assert took < 1 + 2
    assert len(body["unread"]) == PAGE
    assert hung.reads <= 50
    live = [e["lease"]["live"] for e in lease_entries(body["groups"])]
    assert not any("value" in v for v in live)
    assert any("EVENT_LIVE_READ_BUDGET_S" in v["unread"] for v in live)


@override_settings(EVENT_LIVE_READS_PER_REQUEST=7)
def test_the_cap_is_the_setting(shard, big_run):
    body = api_as("view_run", "view_resource").get(f"{API}runs/{big_run.pk}/cleanup-plan/?live=1&page_size=500").json()
    assert shard.reads == 7
    assert len(body["unread"]) == PAGE - 7


def test_without_live_nothing_is_read_and_nothing_is_said_unread(shard, big_run):
    body = api_as("view_run", "view_resource").get(f"{API}runs/{big_run.pk}/cleanup-plan/").json()
    assert shard.reads == 0
    assert "unread" not in body
    assert not any("live" in e["lease"] for e in lease_entries(body["groups"]))


def test_the_admin_live_plan_is_bounded_as_the_apis_and_says_what_it_did_not_read(client, shard, big_run):
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    started = time.monotonic()
    page = client.get(reverse("admin:cleanup_run_change", args=[big_run.pk]) + "?live=1")
    took = time.monotonic() - started

    assert page.status_code == 200
    assert shard.reads == 50
    assert took < 3 + 3
    text = page.content.decode()
    # The page plans its oldest 200 rows: 50 read, 150 said not read.
    assert "150 live values not read in this request" in text
    assert text.count("live now: <strong>5</strong>") == 50


def test_reads_of_one_backend_are_limited_to_the_call_concurrency():
    lease = SlowShard(delay=0.05)
    registry.register_lease(lease)
    with override_settings(EVENT_CALL_CONCURRENCY=3):
        answers = read_live_many([(i, registry.lease_ref("test.rate", f"t{i}"), "") for i in range(12)])
    assert lease.reads == 12 and all(a == {"value": 5} for a in answers.values())
    assert lease.most_at_once == 3


def test_a_failed_read_is_an_error_not_a_value_and_an_unknown_lease_is_not_called():
    registry.register_lease(FakeLease(id="test.bad"))
    registry._leases["test.bad"].read = lambda *, target: {"ok": False, "error": "busy"}
    answers = read_live_many(
        [(1, registry.lease_ref("test.bad", "x"), ""), (2, registry.lease_ref("nobody.rate", "y"), "")]
    )
    assert "error" in answers[1] and "value" not in answers[1]
    assert answers[2] == {"error": 'no module registers the lease "nobody.rate#y"'}
