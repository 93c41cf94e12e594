"""Unknown query parameters, and bad values of known ones, are refused naming them: never ignored.

A console that misspells a filter would otherwise take the whole list for the filtered one.
"""

import pytest
from django.urls import resolve

from cleanup import registry
from cleanup.api import params
from cleanup.models import Resource, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db

API = "/api/v1/events/"
EVERY = (
    "view_run",
    "add_run",
    "change_run",
    "cleanup_run",
    "view_resource",
    "view_runlog",
    "view_modulehealth",
    "view_moduleevent",
)


@pytest.fixture
def api():
    return api_as(*EVERY)


@pytest.fixture
def run():
    registry.register_action(FakeAction())
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    return run


def gets(run):
    row = Resource.objects.get()
    return [
        f"{API}runs/",
        f"{API}runs/{run.pk}/",
        f"{API}runs/{run.pk}/cleanup-plan/",
        f"{API}runs/{run.pk}/resources/",
        f"{API}runs/{run.pk}/log/",
        f"{API}resources/",
        f"{API}resources/{row.pk}/",
        f"{API}modules/",
        f"{API}modules/log/",
        f"{API}modules/test/log/",
        f"{API}summary/",
    ]


@pytest.mark.parametrize("name", ["foo", "since", "search", "stauts", "format"])
def test_every_get_refuses_a_parameter_it_does_not_take_naming_it(api, run, name):
    for path in gets(run):
        response = api.get(path, {name: "x"})
        assert response.status_code == 400, (path, response.content)
        body = response.json()
        assert body["code"] == "unknown_parameter", (path, body)
        assert list(body["errors"]) == [name], (path, body)
        assert name in body["detail"]


def test_the_refusal_says_which_parameters_the_endpoint_takes(api, run):
    body = api.get(f"{API}runs/", {"stauts": "running"}).json()
    assert "status" in body["errors"]["stauts"][0] and "cleanup_status" in body["errors"]["stauts"][0]


def test_known_parameters_still_filter(api, run):
    assert len(api.get(f"{API}runs/", {"status": "aborted"}).json()["results"]) == 1
    assert len(api.get(f"{API}runs/", {"status": "running"}).json()["results"]) == 0


def test_a_write_takes_no_query_parameter(api, run):
    response = api.post(f"{API}runs/{run.pk}/cleanup/?force=1", {}, format="json")
    assert (response.status_code, response.json()["code"], list(response.json()["errors"])) == (
        400,
        "unknown_parameter",
        ["force"],
    )


@pytest.mark.parametrize("value", ["yes", "", "2", "TRUE"])
def test_a_bad_live_value_is_invalid_naming_live(api, run, value):
    response = api.get(f"{API}runs/{run.pk}/cleanup-plan/", {"live": value})
    assert response.status_code == 400
    assert (response.json()["code"], list(response.json()["errors"])) == ("invalid", ["live"])


@pytest.mark.parametrize("value", ["0", "false", "1", "true"])
def test_each_documented_live_value_is_taken(api, run, value):
    assert api.get(f"{API}runs/{run.pk}/cleanup-plan/", {"live": value}).status_code == 200


def test_a_bad_filter_value_is_invalid_naming_it(api, run):
    body = api.get(f"{API}resources/", {"state": "gone", "run": "abc"}).json()
    assert body["code"] == "invalid" and set(body["errors"]) <= {"state", "run"} and body["errors"]


def test_a_parameter_given_twice_is_invalid(api, run):
    response = api.get(f"{API}runs/?status=aborted&status=running")
    assert (response.status_code, response.json()["code"], list(response.json()["errors"])) == (
        400,
        "invalid",
        ["status"],
    )


def test_unknown_parameters_are_checked_after_authentication(run):
    from rest_framework.test import APIClient

    assert APIClient().get(f"{API}runs/", {"foo": "1"}).status_code == 401
    assert api_as("view_run").get(f"{API}resources/", {"foo": "1"}).status_code == 403


def test_the_schema_declares_exactly_the_parameters_each_operation_takes(admin_client, run):
    """What the API refuses as unknown and what the schema offers are the same list."""
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    checked = 0
    for path, operations in schema["paths"].items():
        concrete = path.replace("{id}", str(run.pk)).replace("{name}", "test").replace("{backend}", "north")
        match = resolve(concrete)
        for method, operation in operations.items():
            view = match.func.view_class(**match.func.view_initkwargs)
            view.request = None
            view.kwargs = match.kwargs
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
            assert declared == params.taken(view, method.upper()), (method, path)
            checked += 1
    assert checked >= 20
