"""A run's page: capped sections that scale, its timeline, and a plan that tells the truth about leases."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from cleanup import registry
from cleanup.models import Resource, RunLog, RunStatus, Step
from tests.fakes import FakeAction, FakeLease, Scripted, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


@pytest.fixture
def staffer(client):
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    return client


def big_run(rows, log_entries, steps=20):
    run = make_run(status=RunStatus.ABORTED, name=f"big {rows}", cleanup_status="incomplete")
    step_objs = [make_step(run, position=i) for i in range(steps)]
    Resource.objects.bulk_create(
        Resource(
            run=run,
            step=step_objs[i % steps],
            module="test",
            kind="creature",
            ref=f"orc-{i}",
            state="failed" if i % 10 == 0 else "reverted",
            revert_attempts=3 if i % 10 == 0 else 1,
            last_error="the shard said 503" if i % 10 == 0 else "",
            resolved_at=None if i % 10 == 0 else timezone.now(),
        )
        for i in range(rows)
    )
    RunLog.objects.bulk_create(
        RunLog(run=run, kind="cleanup.failed" if i % 3 else "cleanup.swept", detail={"error": "503", "i": i})
        for i in range(log_entries)
    )
    return run


def open_page(client, run):
    with CaptureQueriesContext(connection) as captured:
        page = client.get(reverse("admin:cleanup_run_change", args=[run.pk]))
    assert page.status_code == 200
    return page.content, len(captured.captured_queries)


def test_a_run_of_ten_thousand_rows_opens_small_in_a_fixed_number_of_queries(staffer):
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    small = big_run(600, 60)
    open_page(staffer, small)  # the first page of a session reads a few things once
    _, small_queries = open_page(staffer, small)
    html, queries = open_page(staffer, big_run(10_000, 3_000))

    assert len(html) < 500_000, f"{len(html)} bytes of HTML"
    assert queries == small_queries, f"{queries} queries for 10,000 rows, {small_queries} for 600"
    page = html.decode()
    assert "Ledger rows: 10000" in page and "1000 unresolved" in page
    assert "Showing 50 of 10000 (unresolved first)" in page
    rows_table = page.split('id="rows"')[1].split("</table>")[0]
    assert rows_table.count("the shard said 503") == 50, "unresolved rows are not first"
    assert "Log: 3000 entries" in page and "Showing the newest 50" in page
    assert "?run__id__exact=" in page


def test_the_timeline_draws_steps_rows_failures_and_the_give_up_on_the_server(staffer):
    run = make_run(status=RunStatus.ABORTED, name="wolf hunt", cleanup_status="incomplete")
    step = make_step(run, finished_at=timezone.now() - timedelta(minutes=3))
    make_rows(step, ["wolf-1", "wolf-2"])
    RunLog.objects.create(run=run, kind="cleanup.failed", detail={"error": "the shard is <down>"})
    RunLog.objects.create(run=run, kind="cleanup.gave_up", detail={})
    page = staffer.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode()
    svg = re.search(r'<svg xmlns="http://www.w3.org/2000/svg".*?</svg>', page, re.S)[0]
    assert "<script" not in svg and "http://" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "failed attempt at" in svg and "the shard is &lt;down&gt;" in svg
    assert "cleanup gave up at" in svg
    assert re.search(r"step 0 test\.spawn: done at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", svg)
    assert "taken: 2" in svg and "given back: 0" in svg


def test_the_plan_shows_each_leases_baseline_applied_value_and_what_the_next_pass_does(staffer):
    lease = FakeLease(values={"camp": 5})
    registry.register_lease(lease)
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    older = make_run(status=RunStatus.COMPLETED, name="boost to 3")
    newer = make_run(status=RunStatus.RUNNING, name="boost to 5")
    make_lease_row(older, baseline=1, applied=3)
    make_lease_row(newer, baseline=3, applied=5)
    stuck = make_rows(make_step(older), ["orc-1"], placeholder=False)[0]
    Resource.objects.filter(pk=stuck.pk).update(state="failed", revert_attempts=3)

    page = staffer.get(reverse("admin:cleanup_run_change", args=[older.pk])).content.decode()
    plan = page.split('id="plan"')[1].split("</table>")[0]
    assert "hand down" in plan and "baseline 1, applied 3" in plan and "hands down to row" in plan
    assert "waiting for a person" in plan, "a row with no attempt left is shown as the next pass's work"
    assert "live now" not in plan and lease.values == {"camp": 5}

    live = staffer.get(reverse("admin:cleanup_run_change", args=[newer.pk]) + "?live=1").content.decode()
    plan = live.split('id="plan"')[1].split("</table>")[0]
    assert "restore" in plan and "live now: <strong>5</strong>" in plan


def test_steps_beyond_the_cap_are_one_link_away(staffer):
    run = make_run(status=RunStatus.COMPLETED)
    Step.objects.bulk_create(
        Step(run=run, position=i, action_id="test.spawn", idempotency_key=f"k-{run.pk}-{i}") for i in range(120)
    )
    page = staffer.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode()
    assert "Showing the first 50" in page
    steps = staffer.get(reverse("admin:cleanup_step_changelist") + f"?run__id__exact={run.pk}")
    assert steps.status_code == 200 and len(steps.context["cl"].result_list) == 100
