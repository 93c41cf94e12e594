"""Charts of a night on the admin index and a run's page, drawn on the server from what the
site already counts: rows given back per minute, module calls' latency and failures by backend."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from cleanup import counters, registry
from cleanup.models import Resource, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


@pytest.fixture
def staffer(client):
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    return client


def given_back(run, refs, minutes_ago):
    rows = make_rows(make_step(run), refs, placeholder=False)
    at = timezone.now() - timedelta(minutes=minutes_ago)
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(state="reverted", resolved_at=at)


def bars_of(svg):
    return [int(n) for n in re.findall(r'<rect class="bar"[^>]*><title>(\d+)</title>', svg)]


def test_the_index_draws_rows_given_back_per_minute_and_calls_by_backend(staffer):
    registry.register_action(FakeAction())
    run = make_run(status=RunStatus.COMPLETED, name="raid", cleanup_status="complete")
    given_back(run, ["orc-1", "orc-2", "orc-3"], minutes_ago=2)
    given_back(run, ["orc-4"], minutes_ago=0)
    given_back(run, ["orc-old"], minutes_ago=90)  # before the last hour: not drawn
    south = {"module": "test", "backend": "south", "verb": "revert"}
    for _ in range(2):
        counters.add("module_calls_total", {**south, "outcome": "timeout"})
    counters.add("module_calls_total", {**south, "outcome": "ok"})
    for _ in range(19):
        counters.observe("module_call_seconds", south, 0.3)
    counters.observe("module_call_seconds", south, 4.0)
    counters.flush()

    page = staffer.get(reverse("admin:index")).content.decode()
    per_minute = re.search(r'<svg[^>]*id="chart-given-back".*?</svg>', page, re.S)[0]
    counts = bars_of(per_minute)
    assert len(counts) == 60 and counts[-1] == 1 and counts[-3] == 3 and sum(counts) == 4
    failures = re.search(r'<svg[^>]*id="chart-failures".*?</svg>', page, re.S)[0]
    assert "test/south: 2" in failures, "the timeouts counted, the answer not"
    latency = re.search(r'<svg[^>]*id="chart-latency".*?</svg>', page, re.S)[0]
    assert "test/south: ≤ 0.5 s" in latency, "19 of 20 calls within 0.5 s: the 95th percentile's bucket"


def test_a_runs_page_draws_its_own_rows_given_back_per_minute(staffer):
    run = make_run(status=RunStatus.COMPLETED, name="raid", cleanup_status="complete")
    given_back(run, ["orc-1", "orc-2"], minutes_ago=3)
    given_back(run, ["orc-3"], minutes_ago=1)
    other = make_run(status=RunStatus.COMPLETED, name="other", cleanup_status="complete")
    given_back(other, ["troll-1"], minutes_ago=2)

    page = staffer.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode()
    chart = re.search(r'<svg[^>]*id="chart-run-given-back".*?</svg>', page, re.S)[0]
    assert bars_of(chart)[:3] == [2, 0, 1] and sum(bars_of(chart)) == 3
