"""The ledger endpoints, waiving by hand, reconcile on demand and the summary."""

from datetime import timedelta

import pytest
from django.utils import timezone

from cleanup import registry
from cleanup.models import Resource, RunStatus
from tests.fakes import FakeAction, Scripted, make_lease_row, make_rows, make_run, make_step, states
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return api_as("view_run", "view_resource", "cleanup_run")


@pytest.fixture
def ledger():
    """Two runs' rows in two modules: an aborted run's failed orc, a completed run's reverted wolf."""
    aborted = make_run(status=RunStatus.ABORTED, name="raid")
    orc = make_rows(make_step(aborted), ["orc-1"], placeholder=False)[0]
    Resource.objects.filter(pk=orc.pk).update(state="failed", revert_attempts=3, last_error="shard said 503")
    done = make_run(status=RunStatus.COMPLETED, name="hunt")
    wolf = make_rows(make_step(done, action_id="forest.spawn"), ["wolf-1"], module="forest", placeholder=False)[0]
    Resource.objects.filter(pk=wolf.pk).update(state="reverted", resolved_at=timezone.now())
    return {"aborted": aborted, "done": done, "orc": orc, "wolf": wolf}


def refs(response):
    assert response.status_code == 200, response.content
    return [r["ref"] for r in response.json()["results"]]


def test_it_lists_the_ledger_and_filters_by_state_module_and_run(api, ledger):
    assert refs(api.get(f"{API}resources/")) == ["orc-1", "wolf-1"]
    assert refs(api.get(f"{API}resources/?state=failed")) == ["orc-1"]
    assert refs(api.get(f"{API}resources/?module=forest")) == ["wolf-1"]
    assert refs(api.get(f"{API}resources/?run={ledger['aborted'].pk}")) == ["orc-1"]
    assert refs(api.get(f"{API}resources/?run={ledger['aborted'].pk}&state=reverted")) == []
    assert refs(api.get(f"{API}resources/?module=nobody")) == []
    assert refs(api.get(f"{API}resources/?module=test%00")) == [], "a NUL must match nothing, not crash"


@pytest.mark.parametrize(
    "query, field, words",
    [
        ("state=gone", "state", "live, reverting, reverted, failed, drifted, orphaned, waived"),
        ("run=abc", "run", "whole number"),
        ("run=-1", "run", "whole number"),
        ("run=99999999999999999999", "run", "whole number from 1 to 9223372036854775807"),
    ],
)
def test_a_bad_ledger_filter_is_400_naming_the_field(api, ledger, query, field, words):
    response = api.get(f"{API}resources/?{query}")
    assert response.status_code == 400
    assert words in response.json()["errors"][field][0]


def test_one_row_reads_with_its_state_and_error(api, ledger):
    body = api.get(f"{API}resources/{ledger['orc'].pk}/").json()
    assert (body["run"], body["module"], body["state"], body["revert_attempts"], body["last_error"]) == (
        ledger["aborted"].pk,
        "test",
        "failed",
        3,
        "shard said 503",
    )
    assert "claim_token" not in body
    assert api.get(f"{API}resources/424242/").status_code == 404


# -- waive ----------------------------------------------------------------------------


def test_waiving_resolves_the_row_with_the_reason_and_the_actor_and_keeps_its_last_error(api, ledger):
    response = api.post(f"{API}resources/{ledger['orc'].pk}/waive/", {"reason": " killed by a GM "}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "waived"
    assert body["last_error"] == "shard said 503"
    assert (body["waived_reason"], body["waived_by"]) == ("killed by a GM", "console")
    assert body["waived_at"] and body["next_attempt_at"] is None
    waived = ledger["aborted"].log.get(kind="resource.waived")
    assert (waived.detail["by"], waived.detail["reason"]) == ("console", "killed by a GM")
    ledger["aborted"].refresh_from_db()
    assert ledger["aborted"].cleanup_status == "complete"


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}, {"reason": None}, {"reason": ["x"]}])
def test_a_waiver_without_a_reason_is_400(api, ledger, body):
    response = api.post(f"{API}resources/{ledger['orc'].pk}/waive/", body, format="json")
    assert response.status_code == 400
    assert "reason" in response.json()["errors"]
    assert states(ledger["aborted"]) == {"orc-1": "failed"}


def test_waiving_a_resolved_row_is_409(api, ledger):
    response = api.post(f"{API}resources/{ledger['wolf'].pk}/waive/", {"reason": "tidy"}, format="json")
    assert response.status_code == 409
    assert "is reverted" in response.json()["detail"]
    assert states(ledger["done"]) == {"wolf-1": "reverted"}
    assert not ledger["done"].log.filter(kind="resource.waived").exists()


def test_waiving_a_row_a_sweeper_holds_is_409(api, ledger):
    Resource.objects.filter(pk=ledger["orc"].pk).update(
        state="reverting", claim_expires_at=timezone.now() + timedelta(minutes=1)
    )
    response = api.post(f"{API}resources/{ledger['orc'].pk}/waive/", {"reason": "tidy"}, format="json")
    assert response.status_code == 409
    assert states(ledger["aborted"]) == {"orc-1": "reverting"}


def test_waiving_an_unknown_row_is_404(api):
    assert api.post(f"{API}resources/424242/waive/", {"reason": "x"}, format="json").status_code == 404


# -- reconcile ------------------------------------------------------------------------


def test_reconcile_queues_and_orphans_what_the_module_no_longer_has(api, django_capture_on_commit_callbacks):
    registry.register_action(FakeAction(reconcile=Scripted({"ok": True, "in_force": ["orc-2"]})))
    run = make_run(status=RunStatus.RUNNING)
    make_rows(make_step(run), ["orc-1", "orc-2"])
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}modules/test/reconcile/", format="json")
    assert response.status_code == 202
    assert response.json() == {"module": "test", "restarted": False, "queued": True, "after": 0}
    assert states(run)["orc-1"] == "orphaned" and states(run)["orc-2"] == "live"


def test_reconcile_after_a_restart_records_again_what_came_back(api, ledger, django_capture_on_commit_callbacks):
    registry.register_action(
        FakeAction(
            id="forest.spawn",
            module="forest",
            reconcile=Scripted({"ok": True, "in_force": ["wolf-1"]}),
            revert=Scripted({"ok": False, "error": "down", "retry": True}),
        )
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}modules/forest/reconcile/", {"restarted": True}, format="json")
    assert response.status_code == 202 and response.json()["restarted"] is True
    again = Resource.objects.get(resurrected_from=ledger["wolf"])
    assert again.ref == "wolf-1"
    assert ledger["done"].log.filter(kind="resource.resurrected").exists()


def test_reconcile_of_an_uninstalled_module_that_owns_rows_is_accepted(api, ledger):
    assert "forest" not in registry.modules()
    assert api.post(f"{API}modules/forest/reconcile/", format="json").status_code == 202


def test_reconcile_of_an_unknown_module_is_404(api, ledger):
    response = api.post(f"{API}modules/atlantis/reconcile/", format="json")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "detail": "Not found."}


def test_reconcile_of_a_name_with_a_nul_byte_is_404_not_a_crash(api, ledger):
    assert api.post(f"{API}modules/forest%00/reconcile/", format="json").status_code == 404


@pytest.mark.parametrize("value", ["true", 1, None])
def test_reconcile_with_a_restarted_that_is_not_a_boolean_is_400(api, ledger, value):
    response = api.post(f"{API}modules/forest/reconcile/", {"restarted": value}, format="json")
    assert response.status_code == 400 and "restarted" in response.json()["errors"]


# -- summary --------------------------------------------------------------------------


def test_the_summary_counts_runs_and_rows(api, ledger):
    make_run(status=RunStatus.RUNNING)
    make_lease_row(ledger["aborted"])
    body = api.get(f"{API}summary/").json()
    assert body["runs"] == {
        "total": 3,
        "status": {"running": 1, "completed": 1, "cancelled": 0, "aborted": 1},
        "cleanup_status": {"not_required": 3, "pending": 0, "complete": 0, "incomplete": 0, "left": 0},
    }
    assert body["resources"] == {
        "total": 3,
        "state": {"live": 1, "reverting": 0, "reverted": 1, "failed": 1, "drifted": 0, "orphaned": 0, "waived": 0},
        "unresolved": 2,
    }
