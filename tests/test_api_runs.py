"""The runs endpoints: list and start, detail, cancel, manual cleanup, plan, ledger and log."""

import pytest

from cleanup import registry
from cleanup.models import Resource, Run, RunLog, RunStatus
from tests.fakes import log_kinds, make_rows, make_run, make_step, states
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return api_as("view_run", "add_run", "change_run", "cleanup_run", "view_resource", "view_runlog")


@pytest.fixture
def failed_run(world):
    """An aborted run whose one row reached the attempt ceiling."""
    run = make_run(status=RunStatus.ABORTED, name="broken raid")
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    world["orc-1"] = "x"
    Resource.objects.update(state="failed", revert_attempts=3, last_error="shard said 503")
    return run


def spawn(count=2):
    return {"action": "test.spawn", "params": {"creature": "orc", "count": count}}


# -- list and filters -----------------------------------------------------------------


def test_it_lists_runs_newest_first_with_their_unresolved_rows(api, failed_run):
    newer = make_run(status=RunStatus.COMPLETED, name="festival")
    body = api.get(f"{API}runs/").json()
    assert len(body["results"]) == 2
    assert [(r["id"], r["unresolved"]) for r in body["results"]] == [(newer.pk, 0), (failed_run.pk, 1)]


def test_it_filters_runs_by_status_and_cleanup_status(api):
    running = make_run(status=RunStatus.RUNNING, name="a")
    done = make_run(status=RunStatus.COMPLETED, name="b", cleanup_status="complete")
    make_run(status=RunStatus.COMPLETED, name="c", cleanup_status="incomplete")

    def ids(query):
        return [r["id"] for r in api.get(f"{API}runs/?{query}").json()["results"]]

    assert ids("status=running") == [running.pk]
    assert ids("status=completed&cleanup_status=complete") == [done.pk]
    assert ids("cleanup_status=pending") == []


def test_an_unknown_filter_value_is_400_naming_the_field_and_the_allowed_values(api):
    response = api.get(f"{API}runs/?status=finished&cleanup_status=done")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert set(errors) == {"status", "cleanup_status"}
    assert "'finished'" in errors["status"][0] and "running, completed, cancelled, aborted" in errors["status"][0]
    assert "not_required, pending, complete, incomplete" in errors["cleanup_status"][0]


def test_the_list_is_paginated(api):
    for name in "abc":
        make_run(name=name)
    first = api.get(f"{API}runs/?page_size=2").json()
    assert [r["name"] for r in first["results"]] == ["c", "b"] and first["previous"] is None
    second = api.get(first["next"]).json()
    assert [r["name"] for r in second["results"]] == ["a"] and second["next"] is None
    assert [r["name"] for r in api.get(second["previous"]).json()["results"]] == ["c", "b"]


# -- starting -------------------------------------------------------------------------


def test_posting_a_spec_starts_the_run_and_it_performs(api, world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}runs/", {"name": "invasion", "steps": [spawn(2)]}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "invasion" and body["status"] == "running"
    assert [(s["position"], s["action"], s["params"]) for s in body["steps"]] == [
        (0, "test.spawn", {"creature": "orc", "count": 2})
    ]
    run = Run.objects.get(pk=body["id"])
    assert run.log.get(kind="run.started").detail["by"] == "console"
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED and len(world) == 0, "the queued tick did not perform and clean up"
    assert "step.performed" in log_kinds(run)


def test_a_bad_spec_is_400_with_the_engines_field_messages(api, world):
    response = api.post(
        f"{API}runs/",
        {"name": " ", "steps": [spawn(), {"action": "nope.spawn"}, {"action": "core.wait", "params": {"seconds": -1}}]},
        format="json",
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors["name"] == ["a run needs a non-empty name"]
    assert errors["steps[1].action"] == ["no module registers the action 'nope.spawn'"]
    assert "seconds" in errors["steps[2].params"][0]
    assert "steps[0].action" not in errors
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ([{"name": "x"}], "non_field_errors"),
        ({"name": "x", "steps": [], "owner": "me"}, "owner"),
        ({"steps": [{"action": "core.wait", "params": {"seconds": 1}}]}, "name"),
        ({"name": "x"}, "steps"),
        ({"name": "x", "steps": "core.wait"}, "steps"),
        ({"name": "x", "steps": ["core.wait"]}, "steps[0]"),
        ({"name": "x", "steps": [{"action": "core.wait", "params": [1]}]}, "steps[0].params"),
    ],
)
def test_a_body_of_the_wrong_shape_is_400_naming_the_field(api, body, field):
    response = api.post(f"{API}runs/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert not Run.objects.exists()


def test_a_body_that_is_not_json_is_400(api):
    response = api.post(f"{API}runs/", '{"name": "x", "steps": [', content_type="application/json")
    assert response.status_code == 400
    assert "JSON" in response.json()["detail"]
    assert api.post(f"{API}runs/", "name=x", content_type="application/x-www-form-urlencoded").status_code == 415


# -- one run --------------------------------------------------------------------------


def test_the_detail_shows_the_run_with_its_steps(api, failed_run):
    body = api.get(f"{API}runs/{failed_run.pk}/").json()
    assert body["status"] == "aborted" and body["unresolved"] == 1
    assert [s["action"] for s in body["steps"]] == ["test.spawn"]


@pytest.mark.parametrize("suffix", ["", "cancel/", "cleanup/", "cleanup-plan/", "resources/", "log/"])
def test_an_unknown_run_is_404(api, suffix):
    method = api.post if suffix in ("cancel/", "cleanup/") else api.get
    response = method(f"{API}runs/424242/{suffix}", format="json")
    assert response.status_code == 404
    assert "detail" in response.json()


# -- cancel ---------------------------------------------------------------------------


def test_cancel_ends_the_run_and_gives_back_what_it_took(api, world, django_capture_on_commit_callbacks):
    run = make_run(status=RunStatus.RUNNING)
    step = make_step(run)
    make_rows(step, ["orc-1"])
    world["orc-1"] = step.idempotency_key
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}runs/{run.pk}/cancel/", {}, format="json")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert run.log.get(kind="run.cancelled").detail == {"by": "console", "cleanup": True}
    assert world == {} and set(states(run).values()) == {"reverted"}


def test_cancel_without_cleanup_leaves_the_rows_for_a_person(api, world, django_capture_on_commit_callbacks):
    run = make_run(status=RunStatus.RUNNING)
    make_rows(make_step(run), ["orc-1"])
    world["orc-1"] = "x"
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}runs/{run.pk}/cancel/", {"cleanup": False}, format="json")
    assert response.status_code == 200
    assert response.json()["auto_cleanup"] is False and response.json()["unresolved"] == 2
    assert "orc-1" in world and states(run)["orc-1"] == "live"


@pytest.mark.parametrize("value", ["yes", "false", 1, 0, None, [True]])
def test_cancel_with_a_cleanup_that_is_not_a_boolean_is_400(api, value):
    run = make_run(status=RunStatus.RUNNING)
    response = api.post(f"{API}runs/{run.pk}/cancel/", {"cleanup": value}, format="json")
    assert response.status_code == 400
    assert "cleanup" in response.json()["errors"]
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING


def test_cancelling_an_ended_run_is_409_with_the_reason(api, failed_run):
    response = api.post(f"{API}runs/{failed_run.pk}/cancel/", {"cleanup": True}, format="json")
    assert response.status_code == 409
    assert "already aborted" in response.json()["detail"]
    failed_run.refresh_from_db()
    assert failed_run.status == RunStatus.ABORTED


# -- manual cleanup and its plan --------------------------------------------------------


def test_a_manual_cleanup_resets_the_attempts_and_really_gives_back(
    api, world, failed_run, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"{API}runs/{failed_run.pk}/cleanup/", format="json")
    assert response.status_code == 202
    body = response.json()
    assert body["reset"] == 1 and body["queued"] is True
    assert body["run"]["id"] == failed_run.pk and body["run"]["cleanup_status"] == "pending"
    assert states(failed_run) == {"orc-1": "reverted"} and world == {}
    assert failed_run.log.get(kind="cleanup.retry").detail["by"] == "console"
    failed_run.refresh_from_db()
    assert failed_run.cleanup_status == "complete"


def test_a_cleanup_of_a_run_in_flight_is_409_and_resets_nothing(api):
    run = make_run(status=RunStatus.RUNNING)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.update(state="failed", revert_attempts=2)
    response = api.post(f"{API}runs/{run.pk}/cleanup/", format="json")
    assert response.status_code == 409
    assert "still running" in response.json()["detail"]
    assert Resource.objects.get().revert_attempts == 2
    assert not run.log.filter(kind="cleanup.retry").exists()


def test_the_cleanup_plan_reads_without_side_effects(api, failed_run):
    before = list(Resource.objects.values())
    logs = RunLog.objects.count()
    response = api.get(f"{API}runs/{failed_run.pk}/cleanup-plan/")
    assert response.status_code == 200
    plan = response.json()
    assert plan["run"] == failed_run.pk
    [group] = plan["groups"]
    assert group["verb"] == "test.spawn.revert" and group["problem"] is None
    assert [(r["ref"], r["state"], r["attempts"], r["attempts_left"], r["last_error"]) for r in group["rows"]] == [
        ("orc-1", "failed", 3, 0, "shard said 503")
    ]
    assert list(Resource.objects.values()) == before and RunLog.objects.count() == logs


def test_the_plan_names_the_problem_of_an_uninstalled_module(api, failed_run):
    registry.unregister_module("test")
    [group] = api.get(f"{API}runs/{failed_run.pk}/cleanup-plan/").json()["groups"]
    assert group["verb"] is None and "test.spawn" in group["problem"]


# -- a run's ledger and log -------------------------------------------------------------


def test_a_runs_resources_are_its_ledger_rows_only(api, failed_run):
    other = make_run(name="other")
    make_rows(make_step(other), ["wolf-1"])
    response = api.get(f"{API}runs/{failed_run.pk}/resources/")
    assert response.status_code == 200
    [row] = response.json()["results"]
    assert (row["ref"], row["state"], row["revert_attempts"], row["last_error"]) == (
        "orc-1",
        "failed",
        3,
        "shard said 503",
    )
    assert len(api.get(f"{API}runs/{other.pk}/resources/?state=live").json()["results"]) == 2
    assert api.get(f"{API}runs/{other.pk}/resources/?state=gone").status_code == 400


def test_a_runs_log_reads_oldest_first(api, world, django_capture_on_commit_callbacks):
    run = make_run(status=RunStatus.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"{API}runs/{run.pk}/cancel/", {"cleanup": False}, format="json")
    RunLog.write(run.pk, "cleanup.retry", by="someone")
    entries = api.get(f"{API}runs/{run.pk}/log/").json()["results"]
    assert [e["kind"] for e in entries] == ["run.cancelled", "cleanup.retry"]
    assert entries[0]["detail"] == {"by": "console", "cleanup": False}
