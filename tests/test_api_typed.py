"""The schema is typed as the API answers: enums for every state, status, log kind and the plan's
`next`, JSON values typed, every error status of every operation declared with the envelope,
and every time RFC 3339 with its zone."""

import re

import pytest

from cleanup import outages, registry
from cleanup.api.errors import CODES
from cleanup.models import (
    CleanupStatus,
    LogKind,
    ModuleEventKind,
    ModuleState,
    Resource,
    ResourceState,
    RunStatus,
    StepStatus,
)
from tests.fakes import FakeAction, FakeLease, make_lease_row, make_rows, make_run, make_step
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db

API = "/api/v1/events/"
NEXT = [
    "restore",
    "hand_down",
    "revert",
    "leave_drifted",
    "waiting_for_person",
    "waiting_for_backend",
    "being_given_back",
]
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@pytest.fixture
def schema(admin_client):
    return admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()


def prop(schema, component, name):
    """A component's property, with ``allOf: [$ref]`` and ``$ref`` followed to the enum or type."""
    found = schema["components"]["schemas"][component]["properties"][name]
    ref = found.get("$ref") or (found.get("allOf") or [{}])[0].get("$ref")
    return schema["components"]["schemas"][ref.rsplit("/", 1)[-1]] if ref else found


@pytest.mark.parametrize(
    "component, name, values",
    [
        ("Run", "status", RunStatus.values),
        ("Run", "cleanup_status", CleanupStatus.values),
        ("Step", "status", StepStatus.values),
        ("Resource", "state", ResourceState.values),
        ("PlanRow", "state", ResourceState.values),
        ("BackendHealth", "state", ModuleState.values),
        ("ModuleHealth", "state", ModuleState.values),
        ("RunLog", "kind", LogKind.values),
        ("ModuleEvent", "kind", ModuleEventKind.values),
        ("PlanGroup", "next", NEXT),
        ("Error", "code", list(CODES)),
    ],
)
def test_every_state_status_kind_and_next_is_an_enum(schema, component, name, values):
    assert prop(schema, component, name)["enum"] == list(values)


@pytest.mark.parametrize(
    "component, name", [("Resource", "payload"), ("Step", "params"), ("RunLog", "detail"), ("ModuleEvent", "detail")]
)
def test_payloads_params_and_details_are_json_objects(schema, component, name):
    assert prop(schema, component, name)["type"] == "object"
    assert prop(schema, component, name)["additionalProperties"] == {}


@pytest.mark.parametrize("name", ["baseline", "applied"])
def test_lease_values_are_any_json_value(schema, name):
    value = prop(schema, "PlanLease", name)
    assert value["nullable"] is True
    assert {branch["type"] for branch in value["anyOf"]} == {"string", "number", "boolean", "object", "array"}
    assert prop(schema, "PlanLive", "value")["anyOf"] == value["anyOf"]
    assert set(prop(schema, "PlanHeir", "resource")) >= {"type"}


def test_every_operation_declares_every_error_it_can_answer_with_the_envelope(schema):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            expected = {"400", "401", "403", "405", "406", "429"}
            if method == "post":
                expected |= {"413", "415"}
            if "{" in path:
                expected.add("404")
            responses = operation["responses"]
            assert expected <= set(responses), (method, path, sorted(responses))
            for status, response in responses.items():
                if int(status) >= 400:
                    body = response["content"]["application/json"]["schema"]
                    assert body == {"$ref": "#/components/schemas/Error"}, (method, path, status)
    cancel = schema["paths"][f"{API}runs/{{id}}/cancel/"]["post"]["responses"]
    assert "run_ended" in cancel["409"]["description"]


def test_the_plan_answers_its_next_as_a_code(api_reader):
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    registry.register_lease(FakeLease(values={"camp": 5}))
    make_lease_row(run)
    nexts = [g["next"] for g in api_reader.get(f"{API}runs/{run.pk}/cleanup-plan/").json()["groups"]]
    assert nexts == ["restore", "revert"]
    plan = api_reader.get(f"{API}runs/{run.pk}/cleanup-plan/?live=1").json()
    assert plan["groups"][0]["rows"][0]["lease"]["live"] == {"value": 5}
    Resource.objects.filter(kind="creature").update(revert_attempts=99)
    nexts = [g["next"] for g in api_reader.get(f"{API}runs/{run.pk}/cleanup-plan/").json()["groups"]]
    assert nexts == ["restore", "waiting_for_person"]


def test_a_group_whose_backend_is_down_waits_for_its_backend(api_reader):
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    outages.mark_down("test", by="alice", reason="deploy")
    [group] = api_reader.get(f"{API}runs/{run.pk}/cleanup-plan/").json()["groups"]
    assert group["next"] == "waiting_for_backend"
    outages.mark_up("test", by="alice")
    [group] = api_reader.get(f"{API}runs/{run.pk}/cleanup-plan/").json()["groups"]
    assert group["next"] == "revert"


@pytest.fixture
def api_reader():
    return api_as("view_run", "view_resource", "view_runlog", "view_modulehealth", "view_moduleevent")


def date_time_names(schema):
    """Every property the schema says is a date-time."""
    return {
        name
        for component in schema["components"]["schemas"].values()
        for name, value in component.get("properties", {}).items()
        if value.get("format") == "date-time"
    }


def times_in(value, names, found):
    if isinstance(value, dict):
        for key, item in value.items():
            if key in names and item is not None:
                found.append((key, item))
            else:
                times_in(item, names, found)
    elif isinstance(value, list):
        for item in value:
            times_in(item, names, found)
    return found


def test_every_time_the_api_answers_is_rfc3339_with_its_zone(schema, api_reader, settings):
    settings.TIME_ZONE = "Europe/Berlin"  # a site in another zone still answers times with their offset
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    run.log.create(kind="run.started", detail={"by": "console"})
    outages.mark_down("test", by="alice", reason="deploy")
    names = date_time_names(schema)
    assert {"created_at", "at", "since", "next_probe_at", "ended_at"} <= names
    found = []
    for path in (
        f"runs/{run.pk}/",
        "runs/",
        "resources/",
        f"runs/{run.pk}/log/",
        "modules/",
        "modules/log/",
        "summary/",
    ):
        response = api_reader.get(API + path)
        assert response.status_code == 200, path
        times_in(response.json(), names, found)
    assert {key for key, _ in found} >= {"created_at", "at", "since"}
    assert [(key, value) for key, value in found if not RFC3339.match(value)] == []


@pytest.mark.parametrize(
    "component, choices",
    [("RunStatusCounts", RunStatus), ("CleanupStatusCounts", CleanupStatus), ("ResourceStateCounts", ResourceState)],
)
def test_the_summary_counts_each_choice_by_a_named_property(schema, api_reader, component, choices):
    counts = schema["components"]["schemas"][component]
    assert sorted(counts["required"]) == sorted(choices.values)
    assert {value["type"] for value in counts["properties"].values()} == {"integer"}
    make_run(status=RunStatus.ABORTED)
    summary = api_reader.get(f"{API}summary/").json()
    assert summary["runs"]["status"] == {**dict.fromkeys(RunStatus.values, 0), "aborted": 1}
