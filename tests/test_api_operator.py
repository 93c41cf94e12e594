"""A person's cleanup through the API: nothing owed is a 409; the plan reads live lease values on request;
and many runs retried at once are passed a moment apart."""

import pytest
from django.test import override_settings

from cleanup import registry
from cleanup.manual import RETRY_GAP_S, clean_in_turn, request_cleanups
from cleanup.models import Resource, RunStatus
from eventsite.sandbox.module import SPAWNER_RATE
from tests import shard as shard_helpers
from tests.fakes import FakeAction, Scripted, log_kinds, make_lease_row, make_rows, make_run, make_step, states
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db
shard_process = shard_helpers.shard_process  # a fixture: a fresh shard per test


@pytest.fixture
def api():
    return api_as("view_run", "change_run", "cleanup_run", "view_resource", "view_runlog")


def test_a_cleanup_of_a_run_that_owes_nothing_is_409_and_changes_nothing(api):
    run = make_run(status=RunStatus.COMPLETED, cleanup_status="complete")
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.update(state="reverted", revert_attempts=1)

    response = api.post(f"{API}runs/{run.pk}/cleanup/", format="json")

    assert response.status_code == 409
    assert "owes nothing" in response.json()["detail"]
    assert "cleanup.retry" not in log_kinds(run)
    run.refresh_from_db()
    assert run.cleanup_status == "complete"
    assert list(Resource.objects.values_list("revert_attempts", flat=True)) == [1]


def test_the_plan_reads_the_live_value_through_the_lease_only_when_asked(api, shard_process):
    with override_settings(SANDBOX_SHARD_URL=shard_process.url, SANDBOX_SHARD_TIMEOUT_MS=2000):
        assert SPAWNER_RATE.apply(value=4.0, run_id=1, target="orc-camp")["ok"] is True
        run = make_run(status=RunStatus.COMPLETED, name="boost")
        make_lease_row(
            run, lease_id="sandbox.spawner_rate", target="orc-camp", baseline=1.0, applied=4.0, module="sandbox"
        )
        plain = api.get(f"{API}runs/{run.pk}/cleanup-plan/").json()
        live = api.get(f"{API}runs/{run.pk}/cleanup-plan/?live=1").json()
        shard_process.post("/faults", json={"down": "503"})
        down = api.get(f"{API}runs/{run.pk}/cleanup-plan/?live=1").json()

    lease = plain["groups"][0]["rows"][0]["lease"]
    assert plain["groups"][0]["next"] == "restore"
    assert (lease["baseline"], lease["applied"], lease["hand_down_to"]) == (1.0, 4.0, None)
    assert "live" not in lease
    assert live["groups"][0]["rows"][0]["lease"]["live"] == {"value": 4.0}
    assert "value" not in down["groups"][0]["rows"][0]["lease"]["live"]
    assert down["groups"][0]["rows"][0]["lease"]["live"]["error"]


def test_a_row_with_no_attempt_left_is_waiting_for_a_person_in_the_plan(api):
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.update(state="failed", revert_attempts=3)
    plan = api.get(f"{API}runs/{run.pk}/cleanup-plan/").json()
    assert plan["groups"][0]["next"] == "waiting_for_person"


def test_many_runs_retried_at_once_are_passed_a_moment_apart(django_capture_on_commit_callbacks, monkeypatch):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    runs = []
    for i in range(4):
        run = make_run(status=RunStatus.ABORTED, name=f"raid {i}")
        make_rows(make_step(run), [f"orc-{i}"], placeholder=False)
        runs.append(run)
    Resource.objects.update(state="failed", revert_attempts=3)
    owes_nothing = make_run(status=RunStatus.COMPLETED, name="clean")
    pauses = []
    monkeypatch.setattr("cleanup.manual.time.sleep", pauses.append)

    with django_capture_on_commit_callbacks(execute=True) as queued:
        accepted, refused = request_cleanups([*runs, owes_nothing], "alice")

    assert len(queued) == 1, "one task works the runs in turn"
    assert [r.pk for r, _ in accepted] == [r.pk for r in runs]
    assert len(refused) == 1 and "owes nothing" in refused[0]
    assert pauses == [RETRY_GAP_S] * 3
    assert all(states(r) == {f"orc-{i}": "reverted"} for i, r in enumerate(runs))
    assert [log_kinds(r).count("cleanup.retry") for r in runs] == [1, 1, 1, 1]


def test_clean_in_turn_passes_each_ended_run_once():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    ended = make_run(status=RunStatus.COMPLETED)
    make_rows(make_step(ended), ["orc-1"], placeholder=False)
    running = make_run(status=RunStatus.RUNNING)
    assert clean_in_turn([ended.pk, running.pk], "bob", sleep=lambda s: None) == 1
    assert states(ended) == {"orc-1": "reverted"}


def test_the_command_refuses_a_persons_retry_of_a_run_that_owes_nothing():
    from django.core.management import CommandError, call_command

    run = make_run(status=RunStatus.COMPLETED, cleanup_status="complete")
    with pytest.raises(CommandError, match="owes nothing"):
        call_command("cleanup_run", str(run.pk), "--reset")
    assert "cleanup.retry" not in log_kinds(run)


@pytest.mark.parametrize("confirmed, expected", [(True, "hand_down"), (False, "restore")])
def test_the_plan_hands_a_lease_down_only_to_a_newer_confirmed_lease(api, confirmed, expected):
    from tests.fakes import FakeLease

    registry.register_lease(FakeLease())
    older = make_run(status=RunStatus.COMPLETED, name="boost to 3")
    newer = make_run(status=RunStatus.RUNNING, name="boost to 5")
    make_lease_row(older, baseline=1, applied=3)
    heir = make_lease_row(newer, baseline=3, applied=5)
    if not confirmed:
        Resource.objects.filter(pk=heir.pk).update(payload={**heir.payload, "confirmed": False})
    group = api.get(f"{API}runs/{older.pk}/cleanup-plan/").json()["groups"][0]
    assert group["next"] == expected
    handed = group["rows"][0]["lease"]["hand_down_to"]
    assert handed == ({"resource": heir.pk, "run": newer.pk} if confirmed else None)
