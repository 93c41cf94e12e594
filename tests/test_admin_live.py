"""Admin pages that stay current: the fragments their live bar reads, what is live now, and honest states.

The index, a run's page and the ledger list each carry a live bar naming a fragment under
the admin; the fragment answers the page's parts as they are now, behind the page's own
permission, checked before anything is read. The index shows the running runs and what
they hold in words; a running run's rows are held, not failures; the ledger search finds
rows by the words of their payload; a row waiting for its backend reads as waiting.
"""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup import outages, registry
from cleanup.admin import resources
from cleanup.admin.summaries import holdings
from cleanup.models import Resource, RunLog, RunStatus, Step, StepStatus
from cleanup.sweep import cleanup_run
from tests.fakes import FakeAction, Scripted, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

INDEX = reverse("admin:index")
LEDGER = reverse("admin:cleanup_resource_changelist")


@pytest.fixture
def staffer(client):
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    return client


def staff_with(client, *codenames):
    user = User.objects.create_user("carol", password="pw-123456789", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="cleanup", codename__in=codenames))
    client.force_login(user)
    return client


def spawned(step, refs, creature, at, module="test"):
    rows = make_rows(step, refs, module=module, placeholder=False)
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(payload={"creature": creature, "at": at, "key": "k"})
    return rows


@pytest.fixture
def invasion():
    """A running run: 3 orc and 1 troll at north-gate, a spawner leased 1.0 -> 5.0, at its wait."""
    run = make_run(status=RunStatus.RUNNING, name="orc invasion", cleanup_status="not_required")
    spawn = make_step(run, position=0, status=StepStatus.DONE)
    spawned(spawn, ["orc-1", "orc-2", "orc-3"], "orc", "north-gate")
    spawned(make_step(run, position=1, status=StepStatus.DONE), ["troll-1"], "troll", "north-gate")
    make_lease_row(run, target="orc-camp", baseline=1.0, applied=5.0)
    make_step(run, position=2, action_id="core.wait", params={"seconds": 600}, status=StepStatus.RUNNING)
    return run


def live_src(page):
    match = re.search(r'id="live-bar" data-live-src="([^"]+)" data-live-every="(\d+)"', page)
    assert match, "the page has no live bar"
    return match[1].replace("&amp;", "&"), int(match[2])


def inline_scripts(page):
    """The script elements that carry code of their own (a CSP without 'unsafe-inline' blocks them)."""
    return [
        tag
        for tag in re.findall(r"<script\b[^>]*>", page)
        if "src=" not in tag and 'type="application/json"' not in tag
    ]


# -- the live bar and its fragments -----------------------------------------------------------


def test_the_index_a_run_and_the_ledger_each_carry_a_live_bar_and_no_inline_script(staffer, invasion):
    pages = {
        "index": INDEX,
        "run": reverse("admin:cleanup_run_change", args=[invasion.pk]),
        "ledger": LEDGER + "?needs=unresolved",
    }
    fragments = {
        "index": reverse("admin:cleanup_live_index"),
        "run": reverse("admin:cleanup_run_live", args=[invasion.pk]),
        "ledger": reverse("admin:cleanup_resource_live") + "?needs=unresolved",
    }
    for name, url in pages.items():
        page = staffer.get(url).content.decode()
        src, every = live_src(page)
        assert src == fragments[name]
        assert every == 5
        assert '<script src="/static/cleanup/live.js" defer></script>' in page
        assert inline_scripts(page) == [], f"the {name} page has inline script"
        assert staffer.get(src).status_code == 200


def test_the_refresh_period_is_a_setting(staffer, settings):
    settings.EVENT_ADMIN_REFRESH_S = 30
    assert live_src(staffer.get(INDEX).content.decode())[1] == 30


def test_a_runs_fragment_answers_its_status_rows_timeline_and_log_as_they_are_now(staffer):
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    run = make_run(status=RunStatus.ABORTED, name="wolf hunt", cleanup_status="pending")
    make_rows(make_step(run), ["wolf-1", "wolf-2"], placeholder=False)
    url = reverse("admin:cleanup_run_live", args=[run.pk])

    before = staffer.get(url).content.decode()
    assert re.search(r'data-live-into="\.fieldBox\.field-cleanup_status \.readonly">pending<', before)
    for part in ("run-actions", "timeline", "rows", "plan", "steps", "log"):
        assert re.search(rf'id="{part}"[^>]*data-live-part', before), f"no live part {part}"
    assert "2 unresolved" in before

    cleanup_run(run, by="test")
    after = staffer.get(url).content.decode()
    assert re.search(r'data-live-into="\.fieldBox\.field-cleanup_status \.readonly">complete<', after)
    assert "unresolved" not in after.split('id="rows"')[1].split("</h2>")[0]
    assert after.split('id="rows"')[1].count(">reverted<") == 2
    assert "cleanup complete at" in after.split('id="timeline"')[1]
    assert "A cleanup pass by test: 2 given back" in after.split('id="log"')[1]


def test_a_runs_fragment_never_reads_the_live_values_of_its_leases(staffer):
    reads = Scripted({"ok": True, "value": 5})
    from tests.fakes import FakeLease

    lease = FakeLease(values={"camp": 5})
    lease.read = reads
    registry.register_lease(lease)
    run = make_run(status=RunStatus.ABORTED, cleanup_status="pending")
    make_lease_row(run)
    page = staffer.get(reverse("admin:cleanup_run_change", args=[run.pk]) + "?live=1").content.decode()
    assert len(reads.calls) == 1, "the page read the live values it was asked for"
    assert not re.search(r'id="plan"[^>]*data-live-part', page), "a refresh would drop the live values read"
    staffer.get(reverse("admin:cleanup_run_live", args=[run.pk]) + "?live=1")
    assert len(reads.calls) == 1, "the fragment read a live value"


@pytest.mark.parametrize(
    "codenames",
    [[], ["view_resource"]],
)
def test_a_runs_fragment_is_refused_before_anything_is_read_without_view_run(client, invasion, codenames):
    staff_with(client, *codenames)
    url = reverse("admin:cleanup_run_live", args=[invasion.pk])
    with CaptureQueriesContext(connection) as captured:
        answer = client.get(url)
    assert answer.status_code == 403
    touched = " ".join(q["sql"] for q in captured.captured_queries)
    assert "cleanup_run" not in touched and "cleanup_resource" not in touched


def test_the_fragments_need_a_staff_login(client, invasion):
    for url in (
        reverse("admin:cleanup_live_index"),
        reverse("admin:cleanup_run_live", args=[invasion.pk]),
        reverse("admin:cleanup_resource_live"),
    ):
        answer = client.get(url)
        assert answer.status_code == 302 and "/admin/login/" in answer["Location"]


def test_the_ledgers_fragment_is_refused_without_view_resource(client, invasion):
    staff_with(client, "view_run")
    assert client.get(reverse("admin:cleanup_resource_live")).status_code == 403


def test_the_ledgers_fragment_answers_the_lists_rows_with_its_filters(staffer, invasion):
    ended = make_run(status=RunStatus.ABORTED, name="wolf hunt", cleanup_status="incomplete")
    wolves = make_rows(make_step(ended), ["wolf-1"], placeholder=False)
    Resource.objects.filter(pk=wolves[0].pk).update(state="failed", revert_attempts=3, last_error="in combat")
    fragment = staffer.get(reverse("admin:cleanup_resource_live") + "?needs=waiting").content.decode()
    assert 'data-live-rows="#result_list"' in fragment
    rows = re.findall(r'<input type="checkbox" name="_selected_action" value="(\d+)"', fragment)
    assert rows == [str(wolves[0].pk)], "the fragment does not list what the filtered page lists"
    assert "in combat" in fragment
    assert staffer.get(reverse("admin:cleanup_resource_live") + "?nonsense=1").status_code == 400


def test_the_index_fragment_answers_the_counts_as_they_are_now(staffer, invasion):
    before = staffer.get(reverse("admin:cleanup_live_index")).content.decode()
    assert re.search(r'id="count-running-runs">1<', before)
    assert 'id="index-live" data-live-part' in before
    make_run(status=RunStatus.RUNNING, name="goblin night")
    after = staffer.get(reverse("admin:cleanup_live_index")).content.decode()
    assert re.search(r'id="count-running-runs">2<', after)
    assert "goblin night" in after


# -- what is live now -----------------------------------------------------------------------


def test_the_index_lists_each_running_run_with_what_it_holds_in_words_and_its_step(staffer, invasion):
    page = staffer.get(INDEX).content.decode()
    live = page.split('id="live-now"')[1].split("</table>")[0]
    assert "orc invasion" in live
    assert "3 orc and 1 troll at north-gate; orc-camp 1.0 → 5.0" in live
    assert "step 3 of 3: core.wait" in live


def test_the_live_view_says_a_waits_time_left(staffer, invasion):
    from datetime import timedelta

    from django.utils import timezone

    type(invasion).objects.filter(pk=invasion.pk).update(wake_at=timezone.now() + timedelta(seconds=42))
    live = staffer.get(INDEX).content.decode().split('id="live-now"')[1]
    assert re.search(r"core\.wait, 4[12] s left", live)


def test_holdings_are_counted_per_creature_and_place_leases_apart_and_placeholders_not_at_all():
    run = make_run(status=RunStatus.RUNNING)
    step = make_step(run)
    spawned(step, [f"orc-{i}" for i in range(20)], "orc", "north-gate")
    spawned(make_step(run), ["troll-1", "troll-2"], "troll", "north-gate")
    spawned(make_step(run), ["wolf-1"], "wolf", "the woods")
    make_rows(make_step(run), [], placeholder=True)
    make_lease_row(run, target="orc-camp", baseline=1.0, applied=5.0)
    Resource.objects.create(run=run, module="test", kind="creature", ref="gone", state="reverted")
    assert holdings([run.pk]) == {run.pk: "20 orc and 2 troll at north-gate; 1 wolf at the woods; orc-camp 1.0 → 5.0"}


def test_a_running_runs_rows_are_held_not_shown_as_failures(staffer, invasion):
    runs = staffer.get(reverse("admin:cleanup_run_changelist")).content.decode()
    assert re.search(r'class="state-held">holds 5<', runs)
    # The list keeps Django's own action bar (a template named like one of the admin's would replace it).
    assert '<select name="action"' in runs and 'id="run-actions"' not in runs
    assert "count-alert" not in runs
    page = staffer.get(reverse("admin:cleanup_run_change", args=[invasion.pk])).content.decode()
    heading = page.split('id="rows"')[1].split("</h2>")[0]
    assert "unresolved" not in heading and "5 held by the running run" in heading
    assert "held by its running run" in page.split('id="rows"')[1]


def test_an_ended_runs_unresolved_rows_are_still_red(staffer):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="incomplete")
    make_rows(make_step(run), ["wolf-1"], placeholder=False)
    runs = staffer.get(reverse("admin:cleanup_run_changelist")).content.decode()
    assert re.search(r'class="count-alert">1<', runs)


# -- the ledger: search, what a row is, honest states ---------------------------------------


def refs_found(client, term):
    page = client.get(LEDGER, {"q": term})
    assert page.status_code == 200
    return {r.ref for r in page.context["cl"].result_list}


def test_the_ledger_search_finds_rows_by_the_words_of_their_payload(staffer, invasion):
    assert refs_found(staffer, "troll") == {"troll-1"}
    assert refs_found(staffer, "north-gate") == {"orc-1", "orc-2", "orc-3", "troll-1"}
    assert refs_found(staffer, "orc-2") == {"orc-2"}
    assert "orc-camp" in {r.split("#")[-1] for r in refs_found(staffer, "override")}


def test_the_ledger_search_reads_a_window_never_the_whole_ledger(staffer, invasion, monkeypatch):
    monkeypatch.setattr(resources, "SEARCH_WINDOW", 3)
    old_done = Resource.objects.get(ref="troll-1")
    Resource.objects.filter(pk=old_done.pk).update(state="reverted")
    ended = make_run(status=RunStatus.COMPLETED)
    spawned(make_step(ended), ["new-1", "new-2", "new-3"], "troll", "south-gate")
    Resource.objects.filter(run=ended).update(state="reverted")
    # The old troll is resolved and out of the window; the running run's unresolved rows stay searchable.
    assert refs_found(staffer, "troll") == {"new-1", "new-2", "new-3"}
    assert refs_found(staffer, "orc") >= {"orc-1", "orc-2", "orc-3"}


def test_the_ledger_shows_what_a_row_is_from_its_payload(staffer, invasion):
    page = staffer.get(LEDGER).content.decode()
    assert re.search(r'<td class="field-what">creature: <span class="what-words">troll at north-gate</span>', page)
    assert re.search(r'<td class="field-what">override: <span class="what-words">orc-camp 1.0 → 5.0</span>', page)


def test_a_row_waiting_for_its_backend_reads_waiting_with_why_on_a_line_of_its_own(staffer):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="pending")
    rows = make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.filter(pk=rows[0].pk).update(state="failed", revert_attempts=0)
    outages.mark_down("test", by="alice", reason="shard deploy")
    page = staffer.get(LEDGER).content.decode()
    cell = re.search(r'<td class="field-state_shown">(.*?)</td>', page)[1]
    assert cell.startswith('<span class="state-waiting">waiting</span><span class="state-line">waiting: test is down')
    assert "failed" not in cell
    attempts = re.search(r'<td class="field-attempt">(.*?)</td>', page)[1]
    assert attempts == "attempt 0 of 3; none spent while it waits", "a waiting row promises a next attempt"
    run_page = staffer.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode()
    assert '<td class="state-waiting">waiting<span class="state-line">waiting: test is down' in run_page


def test_a_row_at_its_ceiling_says_when_it_gave_up(staffer):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="incomplete")
    rows = make_rows(make_step(run), ["wolf-1"], placeholder=False)
    Resource.objects.filter(pk=rows[0].pk).update(state="failed", revert_attempts=3)
    page = staffer.get(LEDGER).content.decode()
    assert re.search(r"given up after 3 of 3 at \d\d-\d\d \d\d:\d\d:\d\d UTC", page)


# -- the log in words, recent actions that say what was done ----------------------------------


def test_a_runs_log_reads_as_sentences_with_labelled_details(staffer):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="incomplete")
    RunLog.write(
        run.pk,
        "cleanup.failed",
        what="sandbox.spawn.revert",
        outcome="retry",
        resources=["creature:wolf-1", "creature:wolf-2"],
        error="refused: the wolf is in combat",
    )
    RunLog.write(run.pk, "cleanup.retry", resources=2, by="alice")
    log = staffer.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode().split('id="log"')[1]
    assert "Could not give back through sandbox.spawn.revert, 2 resources: refused: the wolf is in combat." in log
    assert "A person asked for the cleanup again by alice: 2 rows back under the attempt ceiling." in log
    assert "<dt>resources</dt><dd>creature:wolf-1, creature:wolf-2</dd>" in log
    assert "<dt>by</dt><dd>alice</dd>" in log
    assert "{&#x27;" not in log and "{'" not in log, "a Python dict is shown"
    entry = RunLog.objects.filter(kind="cleanup.retry").get()
    detail = staffer.get(reverse("admin:cleanup_runlog_change", args=[entry.pk])).content.decode()
    assert "<dt>by</dt><dd>alice</dd>" in detail


def test_recent_actions_say_what_was_done(staffer):
    registry.register_action(FakeAction())
    outages.note_boot("test", "", "boot-1")
    from cleanup.models import ModuleHealth

    health = ModuleHealth.objects.get(module="test")
    staffer.post(
        reverse("admin:cleanup_modulehealth_changelist"),
        {"action": "mark_down", "_selected_action": [health.pk], "apply": "1", "reason": "disk swap"},
    )
    index = staffer.get(INDEX).content.decode()
    recent = index.split('id="recent-actions-module"')[1]
    assert "Marked down: disk swap" in recent
    assert "test: down" in recent


def test_the_step_a_run_is_at_is_its_first_not_done(invasion):
    from cleanup.admin.live import current_steps

    assert current_steps([invasion])[invasion.pk] == Step.objects.get(run=invasion, position=2)


def test_a_rows_page_offers_its_waiver_and_its_runs_retry_each_confirmed(staffer):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="incomplete")
    rows = make_rows(make_step(run), ["wolf-1"], placeholder=False)
    Resource.objects.filter(pk=rows[0].pk).update(state="failed", revert_attempts=3, last_error="in combat")
    page = staffer.get(reverse("admin:cleanup_resource_change", args=[rows[0].pk])).content.decode()
    assert 'id="waive-row"' in page and 'id="retry-run"' in page
    asked = staffer.post(LEDGER, {"action": "waive_rows", "_selected_action": [rows[0].pk]})
    assert asked.status_code == 200 and 'name="reason"' in asked.content.decode(), "the waiver is not confirmed"
    assert Resource.objects.get(pk=rows[0].pk).state == "failed"
    confirm = staffer.post(
        reverse("admin:cleanup_run_changelist"), {"action": "clean_up", "_selected_action": [run.pk]}
    )
    assert confirm.status_code == 200 and "Rows reset:" in confirm.content.decode()
    assert Resource.objects.get(pk=rows[0].pk).revert_attempts == 3, "the retry happened before its confirmation"


def test_a_rows_page_offers_nothing_without_cleanup_run_or_once_resolved(client, staffer):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="incomplete")
    failed, done = make_rows(make_step(run), ["wolf-1", "wolf-2"], placeholder=False)
    Resource.objects.filter(pk=failed.pk).update(state="failed", revert_attempts=3)
    Resource.objects.filter(pk=done.pk).update(state="reverted")
    resolved = staffer.get(reverse("admin:cleanup_resource_change", args=[done.pk])).content.decode()
    assert 'id="waive-row"' not in resolved
    staff_with(client, "view_resource", "view_run")
    page = client.get(reverse("admin:cleanup_resource_change", args=[failed.pk])).content.decode()
    assert 'id="waive-row"' not in page and 'id="retry-run"' not in page


# -- a fragment that did not change is not sent again ----------------------------------------


def test_each_fragment_answers_304_with_no_body_while_nothing_changed_and_its_rows_once_they_do(staffer, invasion):
    # The run's page holds a form (its CSRF token masked afresh on every answer): still unchanged.
    ended = make_run(status=RunStatus.COMPLETED, name="wolf hunt", cleanup_status="incomplete")
    make_rows(make_step(ended), ["wolf-1"], placeholder=False)
    Resource.objects.filter(run=ended).update(state="failed", revert_attempts=3)
    fragments = [
        reverse("admin:cleanup_live_index"),
        reverse("admin:cleanup_run_live", args=[ended.pk]),
        reverse("admin:cleanup_resource_live") + "?needs=unresolved",
        reverse("admin:cleanup_modulehealth_live"),
    ]
    for url in fragments:
        first = staffer.get(url)
        assert first.status_code == 200 and first["ETag"], url
        again = staffer.get(url, headers={"If-None-Match": first["ETag"]})
        assert again.status_code == 304, f"{url} sent again unchanged"
        assert again.content == b"" and again["ETag"] == first["ETag"]

    ledger = reverse("admin:cleanup_resource_live") + "?needs=unresolved"
    before = staffer.get(ledger)
    Resource.objects.filter(ref="wolf-1").update(last_error="refused: in combat")
    after = staffer.get(ledger, headers={"If-None-Match": before["ETag"]})
    assert after.status_code == 200 and after["ETag"] != before["ETag"]
    assert "refused: in combat" in after.content.decode()
    assert staffer.get(ledger, headers={"If-None-Match": '"something-else"'}).status_code == 200


def test_the_index_fragment_carries_the_nights_charts_as_a_live_part_drawn_as_they_are_now(staffer, invasion):
    from django.utils import timezone

    registry.register_action(FakeAction())
    try:
        before = staffer.get(reverse("admin:cleanup_live_index")).content.decode()
        assert 'id="night-charts" data-live-part' in before
        assert re.search(r"rows given back per minute, the last hour \(highest \d+, total 0\)", before)
        Resource.objects.filter(run=invasion, ref__startswith="orc").update(
            state="reverted", resolved_at=timezone.now()
        )
        after = staffer.get(reverse("admin:cleanup_live_index")).content.decode()
        assert "the last hour (highest 3, total 3)" in after
        index = staffer.get(INDEX).content.decode()
        assert index.count('id="night-charts"') == 1
    finally:
        registry.unregister_module("test")
