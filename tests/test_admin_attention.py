"""The admin index leads with what needs a person, each count a link to its filtered list."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from cleanup.models import Resource, Run, RunStatus
from tests.fakes import make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


def row(run, ref, **fields):
    r = make_rows(make_step(run), [ref], placeholder=False)[0]
    Resource.objects.filter(pk=r.pk).update(**fields)
    return r


@pytest.fixture
def ledger():
    gave_up = make_run(status=RunStatus.ABORTED, name="wolf hunt", cleanup_status="incomplete")
    pending = make_run(status=RunStatus.COMPLETED, name="orc raid", cleanup_status="pending")
    running = make_run(status=RunStatus.RUNNING, name="festival")
    old = timezone.now() - timedelta(hours=5)
    return {
        "ceiling": row(gave_up, "wolf-at-ceiling", state="failed", revert_attempts=3, last_error="503", created_at=old),
        "terminal": row(gave_up, "wolf-not-retryable", state="failed", revert_attempts=1, retryable=False),
        "drifted": row(gave_up, "rate-drifted", state="drifted", revert_attempts=1),
        "retrying": row(
            pending,
            "orc-retrying",
            state="failed",
            revert_attempts=1,
            next_attempt_at=timezone.now() + timedelta(seconds=40),
        ),
        "fresh": row(pending, "orc-fresh"),
        "resolved": row(pending, "orc-given-back", state="reverted", revert_attempts=1),
        "in_flight": row(running, "orc-of-a-running-run"),
        "runs": (gave_up, pending, running),
    }


def staffer():
    return User.objects.create_superuser("root", password="pw-123456789")


def count(page, element_id):
    match = re.search(rf'id="{element_id}"[^>]*>([^<]+)<', page)
    assert match, f"no #{element_id} on the index"
    return match[1].strip()


def refs_listed(client, url):
    page = client.get(url)
    assert page.status_code == 200
    return {r.ref for r in page.context["cl"].result_list}


def test_it_shows_counts_that_link_to_their_filtered_lists(client, ledger):
    client.force_login(staffer())
    page = client.get(reverse("admin:index")).content.decode()

    assert "Needs attention" in page
    assert count(page, "count-incomplete-runs") == "1"
    assert count(page, "count-waiting") == "3"
    assert count(page, "count-retrying") == "2"
    assert count(page, "oldest-unresolved") == "5 h old"

    incomplete = re.search(r'href="([^"]+)" id="count-incomplete-runs"', page)[1].replace("&amp;", "&")
    listed = client.get(incomplete).context["cl"].result_list
    assert [r.name for r in listed] == ["wolf hunt"]
    waiting = re.search(r'href="([^"]+)" id="count-waiting"', page)[1].replace("&amp;", "&")
    assert refs_listed(client, waiting) == {"wolf-at-ceiling", "wolf-not-retryable", "rate-drifted"}
    retrying = re.search(r'href="([^"]+)" id="count-retrying"', page)[1].replace("&amp;", "&")
    assert refs_listed(client, retrying) == {"orc-retrying", "orc-fresh"}
    oldest = re.search(r'href="([^"]+)" id="oldest-unresolved"', page)[1]
    assert oldest == reverse("admin:cleanup_resource_change", args=[ledger["ceiling"].pk])


def test_its_counts_cost_the_same_queries_whatever_the_resolved_history(client, ledger):
    client.force_login(staffer())

    def queries():
        with CaptureQueriesContext(connection) as captured:
            client.get(reverse("admin:index"))
        return [q["sql"] for q in captured.captured_queries]

    before = queries()
    pending = ledger["runs"][1]
    step = make_step(pending)
    Resource.objects.bulk_create(
        Resource(run=pending, step=step, module="test", kind="creature", ref=f"old-{i}", state="reverted")
        for i in range(500)
    )
    after = queries()
    assert len(after) == len(before)
    counting = [q for q in after if "COUNT(" in q.upper() and "cleanup_resource" in q]
    assert counting and all("state" in q for q in counting), "a count read resolved rows"


def test_a_staff_user_without_ledger_permissions_sees_no_counts(client, ledger):
    User.objects.create_user("guest", password="pw-123456789", is_staff=True)
    client.login(username="guest", password="pw-123456789")
    page = client.get(reverse("admin:index")).content.decode()
    assert "Needs attention" not in page
    assert Run.objects.count() == 3


def failed_step(run, refs, attempts=3):
    """A step whose revert failed as a whole (at the ceiling by default): its placeholder
    failed with its resources, as every row of a call that failed does."""
    rows = make_rows(make_step(run), refs)
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(state="failed", revert_attempts=attempts)
    return rows


def test_a_steps_placeholder_is_not_counted_beside_the_resources_it_stands_for(client):
    hunt = make_run(status=RunStatus.COMPLETED, name="wolf hunt", cleanup_status="incomplete")
    placeholder, *wolves = failed_step(hunt, [f"wolf-{i}" for i in range(6)])
    client.force_login(staffer())
    page = client.get(reverse("admin:index")).content.decode()

    assert count(page, "count-waiting") == "6"
    waiting = re.search(r'href="([^"]+)" id="count-waiting"', page)[1].replace("&amp;", "&")
    assert refs_listed(client, waiting) == {w.ref for w in wolves}
    oldest = re.search(r'href="([^"]+)" id="oldest-unresolved"', page)[1]
    assert oldest != reverse("admin:cleanup_resource_change", args=[placeholder.pk])


def test_a_placeholder_with_nothing_else_left_of_its_step_waits_for_a_person(client):
    """A step that died before recording what it made, and one whose resources were waived:
    the placeholder is all that holds the run, so it is what a person decides on."""
    run = make_run(status=RunStatus.ABORTED, name="lost spawn", cleanup_status="incomplete")
    (died,) = failed_step(run, [])
    waived_step = failed_step(run, ["wolf-1", "wolf-2"])
    Resource.objects.filter(pk__in=[r.pk for r in waived_step[1:]]).update(state="waived")
    retrying = failed_step(run, ["orc-1"], attempts=1)
    client.force_login(staffer())
    page = client.get(reverse("admin:index")).content.decode()

    assert count(page, "count-waiting") == "2"
    waiting = re.search(r'href="([^"]+)" id="count-waiting"', page)[1].replace("&amp;", "&")
    assert refs_listed(client, waiting) == {died.ref, waived_step[0].ref}
    assert count(page, "count-retrying") == "1"
    retrying_link = re.search(r'href="([^"]+)" id="count-retrying"', page)[1].replace("&amp;", "&")
    assert refs_listed(client, retrying_link) == {retrying[1].ref}


def test_waiting_and_retrying_split_the_rows_of_ended_runs_exactly():
    """`waiting_q`, `retrying_q` and the rows left for later are written without negating each
    other (for their plans); together they must still split the rows exactly, over every state, attempt count and claim
    (live or run out, called or not)."""
    import itertools

    from cleanup.admin.lists import ended_unresolved, retrying_q, waiting_q
    from cleanup.rows import left_for_later

    now = timezone.now()
    states = ["live", "reverting", "failed", "drifted", "reverted"]
    claims = {"none": {}, "live": {"claim_expires_at": now + timedelta(minutes=1)}}
    claims["expired"] = {"claim_expires_at": now - timedelta(minutes=1)}
    expected_waiting = set()
    expected_retrying = set()
    expected_left = set()
    for status, auto in itertools.product([RunStatus.RUNNING, RunStatus.COMPLETED, RunStatus.CANCELLED], [True, False]):
        run = make_run(status=status, auto_cleanup=auto)
        for state, retryable, attempts, claim, called in itertools.product(
            states, [True, False], [0, 2, 3], claims, [True, False]
        ):
            r = row(
                run,
                f"{status}-{auto}-{state}-{retryable}-{attempts}-{claim}-{called}",
                state=state,
                retryable=retryable,
                revert_attempts=attempts,
                claim_called=called,
                **claims[claim],
            )
            if status == RunStatus.RUNNING or state == "reverting" and claim == "none" or state == "reverted":
                continue
            # Rule 20: a row being given back is tried again while its claim holds, or once it
            # ran out, while it has attempts left or its dead claim never called.
            in_hand = state == "reverting" and (claim == "live" or attempts < 3 or not called)
            retried = in_hand or (state in ("live", "failed") and retryable and attempts < 3)
            # A run a person ended keeping its rows has them left for later, not given up.
            (expected_left if not auto else expected_retrying if retried else expected_waiting).add(r.pk)

    rows = ended_unresolved().exclude(state="reverting", claim_expires_at__isnull=True)
    assert set(rows.filter(waiting_q(now, 3)).values_list("pk", flat=True)) == expected_waiting
    assert set(rows.filter(retrying_q(now, 3)).values_list("pk", flat=True)) == expected_retrying
    assert set(rows.filter(left_for_later()).values_list("pk", flat=True)) == expected_left
    assert expected_waiting and expected_retrying and expected_left


def test_a_runs_page_and_its_alert_count_its_waiting_rows_as_the_index_does(client):
    from cleanup import alerts

    hunt = make_run(status=RunStatus.COMPLETED, name="wolf hunt", cleanup_status="incomplete")
    failed_step(hunt, ["wolf-1", "wolf-2", "wolf-3"])  # with its placeholder, failed beside them
    client.force_login(staffer())
    index = client.get(reverse("admin:index")).content.decode()
    run_page = client.get(reverse("admin:cleanup_run_change", args=[hunt.pk])).content.decode()

    assert count(index, "count-waiting") == "3"
    assert "<strong>3 unresolved</strong>" in run_page, "the placeholder counted beside its wolves"
    assert alerts.describe(hunt, alerts.GAVE_UP)["unresolved_count"] == 3


def test_every_count_of_a_runs_waiting_rows_says_what_the_index_says(client):
    """The list of runs, the run's page (its heading, its states, its listed rows, its
    cleanup confirmation) and the index count a step's placeholder beside its wolves once:
    through the row owner's `counted_unresolved`, never as a fourth row."""
    hunt = make_run(status=RunStatus.COMPLETED, name="wolf hunt", cleanup_status="incomplete")
    placeholder, *_wolves = failed_step(hunt, ["wolf-1", "wolf-2", "wolf-3"])
    client.force_login(staffer())
    index = client.get(reverse("admin:index")).content.decode()
    runs = client.get(reverse("admin:cleanup_run_changelist"))
    page = client.get(reverse("admin:cleanup_run_change", args=[hunt.pk]))
    confirm = client.post(
        reverse("admin:cleanup_run_changelist"), {"action": "clean_up", "_selected_action": [hunt.pk]}
    ).content.decode()

    assert count(index, "count-waiting") == "3"
    assert runs.context["cl"].result_list[0]._unresolved == 3
    text = page.content.decode()
    assert "<strong>3 unresolved</strong>" in text
    assert re.search(r'id="row-counts">failed: 3 \(and 1 step placeholder', text), "the states add up to 4"
    assert placeholder.pk not in {r.pk for r in page.context["rows"]}, "the placeholder listed as a fourth row"
    assert "Showing" not in text, "3 rows listed of 4 said to be more"
    assert "Rows reset: 3 failed." in confirm


def test_a_running_runs_page_counts_what_it_holds_without_its_steps_placeholder(client):
    raid = make_run(status=RunStatus.RUNNING, name="orc raid")
    make_rows(make_step(raid), ["orc-1", "orc-2"])  # live, with their step's placeholder
    client.force_login(staffer())
    text = client.get(reverse("admin:cleanup_run_change", args=[raid.pk])).content.decode()

    assert "2 held by the running run" in text
    assert re.search(r'id="row-counts">live: 2 \(and 1 step placeholder', text)


def test_a_persons_retry_says_it_reset_the_rows_the_page_counted():
    from cleanup import manual
    from cleanup.models import LogKind, RunLog

    hunt = make_run(status=RunStatus.COMPLETED, name="wolf hunt", cleanup_status="incomplete")
    placeholder, *_wolves = failed_step(hunt, ["wolf-1", "wolf-2", "wolf-3"])

    assert manual.reset_for_person(hunt, "alice") == 3
    assert RunLog.objects.get(run=hunt, kind=LogKind.CLEANUP_RETRY).detail["resources"] == 3
    placeholder.refresh_from_db()
    assert placeholder.revert_attempts == 0, "the placeholder was not reset with its wolves"
