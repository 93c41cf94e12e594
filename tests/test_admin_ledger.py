"""The ledger in the admin: the list that fits a screen, its filters, and honest row pages."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from cleanup.manual import waive
from cleanup.models import Attempt, Resource, RunStatus
from tests.fakes import make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

LIST = reverse("admin:cleanup_resource_changelist")
NOW = timezone.now().replace(microsecond=0)


def row(run, ref, module="test", kind="creature", **fields):
    r = make_rows(make_step(run), [ref], module=module, kind=kind, placeholder=False)[0]
    Resource.objects.filter(pk=r.pk).update(**fields)
    r.refresh_from_db()
    return r


@pytest.fixture
def ledger():
    gave_up = make_run(status=RunStatus.ABORTED, name="wolf hunt", cleanup_status="incomplete")
    pending = make_run(status=RunStatus.COMPLETED, name="orc raid", cleanup_status="pending")
    return {
        "ceiling": row(
            gave_up,
            "wolf-1",
            state="failed",
            revert_attempts=3,
            next_attempt_at=NOW + timedelta(hours=1),
            last_error="<script>alert(1)</script> the shard said 503 " + "x" * 300,
        ),
        "retrying": row(
            pending,
            "orc-1",
            module="sandbox",
            state="failed",
            revert_attempts=1,
            next_attempt_at=NOW + timedelta(seconds=40),
            last_error="timed out",
        ),
        "lease": make_lease_row(pending),
        "done": row(pending, "orc-2", state="reverted", revert_attempts=1),
    }


@pytest.fixture
def staffer(client):
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    return client


def field(page, name):
    """The shown value of a read-only field on an admin page."""
    # A field alone on its line is its row; one of several is a "fieldBox".
    match = re.search(rf'fieldBox field-{name}\b.*?<div class="readonly">(.*?)</div>', page, re.S) or re.search(
        rf'form-row field-{name}".*?<div class="readonly">(.*?)</div>', page, re.S
    )
    assert match, f"no field {name} on the page"
    return match[1]


def listed(client, query=""):
    page = client.get(LIST + query)
    assert page.status_code == 200, page.content[:500]
    return {r.ref for r in page.context["cl"].result_list}


def test_the_list_shows_state_attempts_error_ref_and_run_first(staffer, ledger):
    with time_machine.travel(NOW, tick=False):
        page = staffer.get(LIST).content.decode()
    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', page)
    columns = ["ref_short", "what", "state_shown", "attempt", "error", "module_shown", "run_name", "updated_short"]
    assert headers == columns
    assert "given up after 3 of 3" in page
    assert "attempt 1 of 3; next in 40 s" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "x" * 300 not in page.split("<tbody>")[1].split("title=")[0], "the error is not shortened"
    assert f'<a href="{reverse("admin:cleanup_run_change", args=[ledger["ceiling"].run_id])}">#' in page


@pytest.mark.parametrize(
    "query, refs",
    [
        ("?needs=unresolved", {"wolf-1", "orc-1", "test.rate#camp"}),
        ("?needs=retrying", {"orc-1", "test.rate#camp"}),
        ("?needs=waiting", {"wolf-1"}),
        ("?state__exact=reverted", {"orc-2"}),
        ("?module=sandbox", {"orc-1"}),
        ("?kind=override", {"test.rate#camp"}),
        ("?run__cleanup_status__exact=incomplete", {"wolf-1"}),
        ("?q=orc-", {"orc-1", "orc-2"}),
    ],
)
def test_the_filters_and_the_search_narrow_the_ledger(staffer, ledger, query, refs):
    assert listed(staffer, query) == refs


def test_the_list_never_counts_or_distincts_the_whole_ledger(staffer, ledger):
    with CaptureQueriesContext(connection) as captured:
        listed(staffer, "?needs=unresolved")
        listed(staffer)
    for q in (c["sql"] for c in captured.captured_queries if "cleanup_resource" in c["sql"]):
        upper = q.upper()
        if "DISTINCT" in upper:
            assert "STATE" in upper and "IN (" in upper, f"a DISTINCT over the whole ledger: {q}"
        if "COUNT(" in upper:
            assert "LIMIT" in upper, f"an unbounded count: {q}"


def test_a_rows_page_shows_every_attempts_error_newest_first_and_no_next_attempt_at_the_ceiling(staffer, ledger):
    r = ledger["ceiling"]
    for number, error in [(1, "connection refused"), (2, "timed out"), (3, "the shard said 503")]:
        Attempt.objects.create(
            resource=r,
            run_id=r.run_id,
            number=number,
            outcome="retry",
            error=error,
            at=NOW - timedelta(minutes=10 - number),
            by="sweep",
        )
    page = staffer.get(reverse("admin:cleanup_resource_change", args=[r.pk])).content.decode()
    history = page.split('class="attempt-history"')[1]
    assert history.index("the shard said 503") < history.index("timed out") < history.index("connection refused")
    assert (NOW - timedelta(minutes=7)).strftime("%Y-%m-%d %H:%M:%S") in history, "attempt times are not to the second"
    assert "x" * 300 in page, "the whole error is not on the row's page"
    next_attempt = field(page, "next_try")
    assert "none: given up after 3 of 3" in next_attempt
    assert (NOW + timedelta(hours=1)).strftime("%H:%M:%S") not in next_attempt


def test_a_waiver_keeps_the_last_error_and_shows_reason_person_and_time_apart(staffer, ledger):
    r = ledger["retrying"]
    with time_machine.travel(NOW, tick=False):
        assert waive([r], "the orc became a quest giver", "alice") == 1
    page = staffer.get(reverse("admin:cleanup_resource_change", args=[r.pk])).content.decode()
    assert "timed out" in field(page, "last_error_whole")
    assert "the orc became a quest giver" in field(page, "waived_reason")
    assert "alice" in field(page, "waived_by")
    assert NOW.strftime("%Y-%m-%d %H:%M:%S") in field(page, "waived_when")
    assert "none: waived" in field(page, "next_try")


def test_an_ended_run_shows_no_wake_time(staffer):
    run = make_run(status=RunStatus.ABORTED, wake_at=NOW + timedelta(minutes=5))
    page = staffer.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode()
    assert (NOW + timedelta(minutes=5)).strftime("%H:%M:%S") not in field(page, "wakes")
    running = make_run(status=RunStatus.RUNNING, wake_at=NOW + timedelta(minutes=5))
    page = staffer.get(reverse("admin:cleanup_run_change", args=[running.pk])).content.decode()
    assert (NOW + timedelta(minutes=5)).strftime("%Y-%m-%d %H:%M:%S") in field(page, "wakes")
