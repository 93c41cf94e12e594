"""What a console needs of the actions: a cleanup with or without reset, a waiver of many rows,
and every 202 saying what to follow (Location) and from where in the feed (after)."""

import pytest

from cleanup import registry
from cleanup.feed import entries_after, position
from cleanup.models import Resource, Run, RunLog, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return api_as("view_run", "add_run", "change_run", "cleanup_run", "view_resource", "view_runlog")


@pytest.fixture
def reverts():
    calls = []

    def revert(**kwargs):
        calls.append(kwargs)
        return {"ok": True, "failed": []}

    registry.register_action(FakeAction(revert=revert))
    return calls


@pytest.fixture
def gave_up(reverts):
    """An aborted run with two rows at the attempt ceiling and one still retrying."""
    run = make_run(status=RunStatus.ABORTED, name="broken raid", cleanup_status="incomplete")
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    make_rows(make_step(run), ["orc-3"], placeholder=False)
    Resource.objects.update(state="failed", revert_attempts=3, last_error="shard said 503")
    Resource.objects.filter(ref="orc-3").update(revert_attempts=1)
    return run


def test_cleanup_with_reset_false_queues_a_pass_and_keeps_the_counters(
    api, gave_up, reverts, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}runs/{gave_up.pk}/cleanup/", {"reset": False}, format="json")
    assert response.status_code == 202
    body = response.json()
    assert body["reset"] == 0 and body["queued"] is True
    # The pass ran (the queue is synchronous in tests): the row under the ceiling was given
    # back, the two at the ceiling were not tried and kept their counters.
    assert [r["ref"] for call in reverts for r in call["resources"]] == ["orc-3"]
    assert dict(Resource.objects.values_list("ref", "state")) == {
        "orc-1": "failed",
        "orc-2": "failed",
        "orc-3": "reverted",
    }
    assert set(Resource.objects.filter(state="failed").values_list("revert_attempts", flat=True)) == {3}
    retry = RunLog.objects.get(run=gave_up, kind="cleanup.retry")
    assert retry.detail["reset"] is False and retry.detail["by"] == "console"


def test_cleanup_resets_by_default_and_with_reset_true(api, reverts, django_capture_on_commit_callbacks):
    for body in ({}, {"reset": True}):
        run = make_run(status=RunStatus.ABORTED, name="broken raid")
        make_rows(make_step(run), ["orc-1"], placeholder=False)
        Resource.objects.filter(run=run).update(state="failed", revert_attempts=3)
        with django_capture_on_commit_callbacks(execute=True):
            response = api.post(f"{API}runs/{run.pk}/cleanup/", body, format="json")
        assert response.status_code == 202 and response.json()["reset"] == 1
        assert Resource.objects.get(run=run).state == "reverted"
    assert len(reverts) == 2


def test_cleanup_refuses_a_reset_that_is_not_a_boolean(api, gave_up):
    response = api.post(f"{API}runs/{gave_up.pk}/cleanup/", {"reset": "no"}, format="json")
    assert response.status_code == 400 and "reset" in str(response.json())
    assert not RunLog.objects.filter(kind="cleanup.retry").exists()


def test_a_cleanups_202_names_the_run_and_the_feed_position_before_its_work(
    api, gave_up, django_capture_on_commit_callbacks
):
    RunLog.objects.create(run=gave_up, kind="run.aborted", detail={})
    before = position()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}runs/{gave_up.pk}/cleanup/", {}, format="json")
    after = response.json()["after"]
    assert after == before > 0
    assert response["Location"] == f"http://testserver{API}runs/{gave_up.pk}/"
    assert api.get(response["Location"]).json()["id"] == gave_up.pk
    written = [entry["kind"] for entry in entries_after(after, 100)]
    assert "cleanup.retry" in written and "cleanup.reverted" in written
    assert "run.aborted" not in written


def test_a_reconciles_202_names_the_modules_log_and_the_feed_position(api, gave_up):
    RunLog.objects.create(run=gave_up, kind="run.aborted", detail={})
    before = position()
    module = api.post(f"{API}modules/test/reconcile/", {}, format="json")
    backend = api.post(f"{API}modules/test/backends/east/reconcile/", {}, format="json")
    assert module.status_code == backend.status_code == 202
    assert module.json()["after"] == before > 0
    assert backend.json()["after"] >= before
    assert module["Location"] == f"http://testserver{API}modules/test/log/"
    assert backend["Location"] == f"http://testserver{API}modules/test/log/?backend=east"


def test_a_started_run_answers_its_location(api):
    response = api.post(
        f"{API}runs/", {"name": "raid", "steps": [{"action": "core.wait", "params": {"seconds": 60}}]}, format="json"
    )
    assert response.status_code == 201
    assert response["Location"] == f"http://testserver{API}runs/{response.json()['id']}/"


# -- waiving many rows --------------------------------------------------------------------


def test_a_run_waiver_waives_the_rows_named_and_only_them(api, gave_up):
    first, second, third = Resource.objects.filter(run=gave_up).order_by("id")
    response = api.post(
        f"{API}runs/{gave_up.pk}/waive/", {"reason": "gone by hand", "rows": [first.pk, third.pk]}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["waived"] == 2 and response.json()["run"]["unresolved"] == 1
    states = dict(Resource.objects.values_list("id", "state"))
    assert states == {first.pk: "waived", second.pk: "failed", third.pk: "waived"}
    assert Resource.objects.get(pk=first.pk).waived_by == "console"
    assert RunLog.objects.filter(run=gave_up, kind="resource.waived").count() == 2


def test_a_run_waiver_of_all_waives_every_unresolved_row_and_the_run_owes_nothing(api, gave_up):
    other = make_run(status=RunStatus.ABORTED, name="other raid")
    make_rows(make_step(other), ["wolf-1"], placeholder=False)
    response = api.post(f"{API}runs/{gave_up.pk}/waive/", {"reason": "shard wiped", "rows": "all"}, format="json")
    assert response.status_code == 200 and response.json()["waived"] == 3
    assert set(Resource.objects.filter(run=gave_up).values_list("state", flat=True)) == {"waived"}
    assert Resource.objects.get(run=other).state == "live"
    assert Run.objects.get(pk=gave_up.pk).cleanup_status == "complete"
    # Nothing is left to waive: a second waiver is refused.
    again = api.post(f"{API}runs/{gave_up.pk}/waive/", {"reason": "shard wiped", "rows": "all"}, format="json")
    assert again.status_code == 409


def test_a_run_waiver_naming_another_runs_row_is_400_and_waives_nothing(api, gave_up):
    other = make_run(status=RunStatus.ABORTED, name="other raid")
    stranger = make_rows(make_step(other), ["wolf-1"], placeholder=False)[0]
    mine = Resource.objects.filter(run=gave_up).first()
    response = api.post(
        f"{API}runs/{gave_up.pk}/waive/", {"reason": "x", "rows": [mine.pk, stranger.pk]}, format="json"
    )
    assert response.status_code == 400
    assert str(stranger.pk) in response.json()["errors"]["rows"][0]
    assert not Resource.objects.filter(state="waived").exists()


@pytest.mark.parametrize(
    "rows", [[], "some", [True], [0], ["3"], list(range(1, 1002)), None], ids=lambda v: repr(v)[:20]
)
def test_a_run_waiver_refuses_rows_that_are_neither_ids_nor_all(api, gave_up, rows):
    response = api.post(f"{API}runs/{gave_up.pk}/waive/", {"reason": "x", "rows": rows}, format="json")
    assert response.status_code == 400 and "rows" in response.json()["errors"]
    assert not Resource.objects.filter(state="waived").exists()


def test_a_run_waiver_needs_a_reason(api, gave_up):
    response = api.post(f"{API}runs/{gave_up.pk}/waive/", {"rows": "all"}, format="json")
    assert response.status_code == 400 and "reason" in response.json()["errors"]
    assert api.post(f"{API}runs/999999/waive/", {"reason": "x", "rows": "all"}, format="json").status_code == 404
