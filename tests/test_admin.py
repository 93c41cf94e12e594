"""The admin shows runs and the ledger, and its actions go through the engine, gated."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from cleanup import registry
from cleanup.models import LogKind, Resource, RunLog, RunStatus
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


def staff(*perms):
    user = User.objects.create_user("staffer", password="pw-123456789", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="cleanup"))
    return user


@pytest.fixture
def failed_run():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = make_run(status=RunStatus.ABORTED, name="broken raid")
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.update(state="failed", revert_attempts=3, last_error="shard said 503")
    return run


def test_the_run_page_shows_the_ledger_with_its_errors(client, failed_run):
    client.force_login(staff("view_run", "view_resource", "view_step", "view_runlog"))
    page = client.get(reverse("admin:cleanup_run_change", args=[failed_run.pk]))
    assert page.status_code == 200
    assert b"shard said 503" in page.content and b"orc-1" in page.content
    assert b"test.spawn.revert" in page.content, "the cleanup plan is not shown"
    listing = client.get(reverse("admin:cleanup_resource_changelist") + "?state__exact=failed")
    assert b"orc-1" in listing.content


def test_it_confirms_clean_up_now_showing_the_reset_and_the_pass_then_gives_back(
    client, failed_run, django_capture_on_commit_callbacks
):
    client.force_login(staff("view_run", "change_run", "cleanup_run"))
    url = reverse("admin:cleanup_run_changelist")
    asked = client.post(url, {"action": "clean_up", "_selected_action": [failed_run.pk]})
    assert asked.status_code == 200
    assert b"Rows reset: 1 failed" in asked.content and b"test.spawn.revert" in asked.content
    assert b"shard said 503" in asked.content and b'name="apply"' in asked.content
    assert states(failed_run) == {"orc-1": "failed"} and not failed_run.log.filter(kind="cleanup.retry").exists()

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, {"action": "clean_up", "_selected_action": [failed_run.pk], "apply": "1"})
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:cleanup_run_change", args=[failed_run.pk])
    assert states(failed_run) == {"orc-1": "reverted"}
    assert failed_run.log.get(kind="cleanup.retry").detail["by"] == "staffer"
    entry = LogEntry.objects.get(object_id=str(failed_run.pk))
    assert (entry.user.username, entry.change_message) == ("staffer", "Clean up now: 1 row(s) reset, a pass queued")
    assert "broken raid" in client.get(reverse("admin:index")).content.decode()  # in recent actions


def test_it_changes_nothing_and_says_so_when_the_run_owes_nothing(client, failed_run):
    Resource.objects.update(state="reverted")
    client.force_login(staff("view_run", "change_run", "cleanup_run"))
    url = reverse("admin:cleanup_run_changelist")
    asked = client.post(url, {"action": "clean_up", "_selected_action": [failed_run.pk]})
    assert b"Nothing will change" in asked.content and b"owes nothing" in asked.content
    response = client.post(url, {"action": "clean_up", "_selected_action": [failed_run.pk], "apply": "1"}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert any("owes nothing" in m for m in shown), shown
    assert not failed_run.log.filter(kind="cleanup.retry").exists()
    assert not LogEntry.objects.exists()


def test_the_actions_need_their_permissions(client, failed_run):
    client.force_login(staff("view_run", "view_resource"))
    page = client.get(reverse("admin:cleanup_run_changelist"))
    assert b"clean_up" not in page.content and b"cancel_with_cleanup" not in page.content
    assert b"clean-up-now" not in client.get(reverse("admin:cleanup_run_change", args=[failed_run.pk])).content
    for action in ("clean_up", "cancel_with_cleanup"):
        asked = client.post(
            reverse("admin:cleanup_run_changelist"),
            {"action": action, "_selected_action": [failed_run.pk], "apply": "1"},
        )
        assert b"Confirm" not in asked.content
    client.post(
        reverse("admin:cleanup_resource_changelist"),
        {
            "action": "waive_rows",
            "_selected_action": list(Resource.objects.values_list("pk", flat=True)),
            "apply": "1",
            "reason": "no",
        },
    )
    assert states(failed_run) == {"orc-1": "failed"}
    assert not failed_run.log.exclude(kind__startswith="run.").exists()


def test_waive_asks_for_a_reason_then_resolves_by_hand_and_logs_who_and_why(client, failed_run):
    client.force_login(staff("view_resource", "change_resource", "cleanup_run"))
    selected = list(Resource.objects.values_list("pk", flat=True))
    url = reverse("admin:cleanup_resource_changelist")

    asked = client.post(url, {"action": "waive_rows", "_selected_action": selected})
    assert asked.status_code == 200 and b'name="reason"' in asked.content
    assert states(failed_run) == {"orc-1": "failed"}, "waived before a reason was given"
    blank = client.post(url, {"action": "waive_rows", "_selected_action": selected, "apply": "1", "reason": "  "})
    assert b"errorlist" in blank.content and states(failed_run) == {"orc-1": "failed"}
    client.post(
        url,
        {"action": "waive_rows", "_selected_action": selected, "apply": "1", "reason": "the orc became a quest giver"},
    )

    assert states(failed_run) == {"orc-1": "waived"}
    waived = failed_run.log.get(kind="resource.waived")
    assert (waived.detail["by"], waived.detail["reason"]) == ("staffer", "the orc became a quest giver")
    failed_run.refresh_from_db()
    assert failed_run.cleanup_status == "complete"


def test_cancel_is_confirmed_ends_running_runs_and_reports_ended_ones(client):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    running = make_run(status=RunStatus.RUNNING, name="live raid")
    ended = make_run(status=RunStatus.COMPLETED, name="old raid")
    make_rows(make_step(running), ["orc-1"], placeholder=False)
    client.force_login(staff("view_run", "change_run"))
    selected = {"action": "cancel_without_cleanup", "_selected_action": [running.pk, ended.pk]}

    asked = client.post(reverse("admin:cleanup_run_changelist"), selected)
    assert b"Will be cancelled" in asked.content and b"has already ended" in asked.content
    running.refresh_from_db()
    assert running.status == "running"
    response = client.post(reverse("admin:cleanup_run_changelist"), {**selected, "apply": "1"}, follow=True)

    running.refresh_from_db()
    assert (running.status, running.auto_cleanup) == ("cancelled", False)
    assert states(running) == {"orc-1": "live"}
    shown = [str(m) for m in response.context["messages"]]
    assert "Cancelled 1 run(s)." in shown
    assert f"run {ended.pk} is already completed; only a running run can be cancelled" in shown
    assert LogEntry.objects.get().object_id == str(running.pk)


def test_no_run_is_ever_deleted_nor_any_ledger_row(client, failed_run):
    user = User.objects.create_superuser("root", password="pw-123456789")
    client.force_login(user)
    assert client.get(reverse("admin:cleanup_run_delete", args=[failed_run.pk])).status_code == 403
    row = Resource.objects.get()
    assert client.get(reverse("admin:cleanup_resource_delete", args=[row.pk])).status_code == 403
    assert b"delete_selected" not in client.get(reverse("admin:cleanup_run_changelist")).content

    # Not even an ended run that owes nothing: its ledger is the record of what it did.
    Resource.objects.update(state="reverted")
    assert client.get(reverse("admin:cleanup_run_delete", args=[failed_run.pk])).status_code == 403
    page = client.get(reverse("admin:cleanup_run_change", args=[failed_run.pk])).content
    assert b"deletelink" not in page


def test_run_and_row_pages_are_read_only(client, failed_run):
    user = User.objects.create_superuser("root", password="pw-123456789")
    client.force_login(user)
    row = Resource.objects.get()
    for url in (
        reverse("admin:cleanup_run_change", args=[failed_run.pk]),
        reverse("admin:cleanup_resource_change", args=[row.pk]),
    ):
        page = client.get(url)
        assert page.status_code == 200 and b'name="_save"' not in page.content
        assert client.post(url, {"name": "renamed", "state": "reverted"}).status_code == 403
    failed_run.refresh_from_db()
    assert failed_run.name == "broken raid" and states(failed_run) == {"orc-1": "failed"}
    assert not LogEntry.objects.exists()


def test_the_log_offers_every_kind_of_entry_as_a_filter(client):
    client.force_login(staff("view_runlog"))
    page = client.get(reverse("admin:cleanup_runlog_changelist")).content.decode()
    offered = {kind for kind in LogKind.values if f'href="?kind={kind}"' in page}
    assert offered == set(LogKind.values)


def test_the_log_filters_by_step_waiting(client):
    client.force_login(staff("view_runlog"))
    run = make_run(status=RunStatus.RUNNING, name="held raid")
    waiting = RunLog.objects.create(run=run, kind=LogKind.STEP_WAITING, detail={"backend": "north"})
    RunLog.objects.create(run=run, kind=LogKind.STEP_PERFORMED, detail={})
    RunLog.objects.create(run=run, kind=LogKind.RUN_STARTED, detail={})

    response = client.get(reverse("admin:cleanup_runlog_changelist"), {"kind": "step.waiting"})

    assert response.status_code == 200
    assert [entry.pk for entry in response.context["cl"].result_list] == [waiting.pk]
