"""The OpenAPI schema: served, valid, generated without warnings, and true of the API.

The last test is a property test: schemathesis generates requests for every GET of the
schema, sends them to the Django app in-process, and checks that none answers 5xx and
that every answer conforms to the schema.
"""

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from drf_spectacular.validation import validate_schema
from hypothesis import HealthCheck, given, settings

from cleanup import registry
from cleanup.api.tokens import issue
from cleanup.models import Resource, ResourceState, RunStatus
from eventsite.wsgi import application
from tests.fakes import FakeAction, make_lease_row, make_rows, make_run, make_step
from tests.test_api_access import user_with

pytestmark = pytest.mark.django_db

PATHS = [
    "/api/v1/events/runs/",
    "/api/v1/events/runs/{id}/",
    "/api/v1/events/runs/{id}/cancel/",
    "/api/v1/events/runs/{id}/cleanup/",
    "/api/v1/events/runs/{id}/cleanup-plan/",
    "/api/v1/events/runs/{id}/resources/",
    "/api/v1/events/runs/{id}/log/",
    "/api/v1/events/resources/",
    "/api/v1/events/resources/{id}/",
    "/api/v1/events/resources/{id}/waive/",
    "/api/v1/events/modules/",
    "/api/v1/events/modules/log/",
    "/api/v1/events/modules/{name}/down/",
    "/api/v1/events/modules/{name}/up/",
    "/api/v1/events/modules/{name}/log/",
    "/api/v1/events/modules/{name}/reconcile/",
    "/api/v1/events/modules/{name}/backends/{backend}/down/",
    "/api/v1/events/modules/{name}/backends/{backend}/up/",
    "/api/v1/events/modules/{name}/backends/{backend}/reconcile/",
    "/api/v1/events/summary/",
    "/api/v1/events/changes/",
]
POSTS = {
    "/api/v1/events/runs/{id}/cancel/",
    "/api/v1/events/runs/{id}/cleanup/",
    "/api/v1/events/resources/{id}/waive/",
    "/api/v1/events/modules/{name}/down/",
    "/api/v1/events/modules/{name}/up/",
    "/api/v1/events/modules/{name}/reconcile/",
    "/api/v1/events/modules/{name}/backends/{backend}/down/",
    "/api/v1/events/modules/{name}/backends/{backend}/up/",
    "/api/v1/events/modules/{name}/backends/{backend}/reconcile/",
}


def test_the_schema_endpoint_answers_a_valid_openapi_document(admin_client):
    response = admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    validate_schema(schema)
    assert set(PATHS) <= set(schema["paths"])
    start = schema["paths"]["/api/v1/events/runs/"]["post"]
    assert start["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RunStart"}
    assert {"201", "400", "401", "403"} <= set(start["responses"])
    assert {"200", "400", "404", "409"} <= set(schema["paths"]["/api/v1/events/runs/{id}/cancel/"]["post"]["responses"])
    assert set(schema["components"]["securitySchemes"]) == {"tokenAuth", "cookieAuth"}


def test_the_schema_names_each_backend(admin_client):
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    for component in ("Resource", "Step", "ModuleEvent", "BackendHealth", "ModuleDown", "BackendReconcileQueued"):
        assert "backend" in components[component]["properties"], component
    backends = components["ModuleHealth"]["properties"]["backends"]
    assert backends["items"] == {"$ref": "#/components/schemas/BackendHealth"}
    assert {"state", "since", "last_error", "next_probe_at", "boot_id", "waiting"} <= set(
        components["BackendHealth"]["properties"]
    )
    paths = schema["paths"]
    for path in ("/api/v1/events/resources/", "/api/v1/events/runs/{id}/resources/", "/api/v1/events/modules/log/"):
        assert "backend" in {p["name"] for p in paths[path]["get"]["parameters"]}, path
    down = paths["/api/v1/events/modules/{name}/backends/{backend}/down/"]["post"]
    assert {"200", "400", "404", "409"} <= set(down["responses"])
    assert down["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/MarkDown"}
    reconcile = paths["/api/v1/events/modules/{name}/backends/{backend}/reconcile/"]["post"]
    assert {"202", "400", "404"} <= set(reconcile["responses"])


def test_the_schema_states_what_the_server_checks_of_bodies_keys_and_cursors(admin_client):
    import re

    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components, paths = schema["components"]["schemas"], schema["paths"]
    reason = components["Waive"]["properties"]["reason"]
    assert (reason["minLength"], reason["maxLength"]) == (1, 1000)
    clean = re.compile(reason["pattern"])
    assert clean.search("the shard was wiped") and clean.search("\ttabbed")
    for refused in ("", "   ", "a\nb", "a\x00", "a\u202eb", "a\x85b"):
        assert not clean.search(refused), repr(refused)
    start = components["RunStart"]["properties"]
    assert start["name"]["pattern"] == reason["pattern"] and start["name"]["minLength"] == 1
    assert (start["steps"]["minItems"], start["steps"]["maxItems"]) == (1, 1000)
    assert components["StepSpec"]["properties"]["action"]["minLength"] == 1
    assert components["RunWaive"]["properties"]["reason"]["minLength"] == 1
    assert components["MarkDown"]["properties"]["reason"]["minLength"] == 1

    key = next(p for p in paths["/api/v1/events/runs/"]["post"]["parameters"] if p["name"] == "Idempotency-Key")
    alphabet = re.compile(key["schema"]["pattern"])
    assert alphabet.search("3f2c8e1a-0d4b-4c1e-9a57-7f3b2d9e6c10")
    assert not any(alphabet.search(k) for k in ("clé", "a\x01", "   ", ""))

    cursor = next(p for p in paths["/api/v1/events/runs/"]["get"]["parameters"] if p["name"] == "cursor")
    assert cursor["schema"]["minLength"] == 1 and not re.search(cursor["schema"]["pattern"], "a+b")
    backend = next(
        p
        for p in paths["/api/v1/events/modules/{name}/backends/{backend}/down/"]["post"]["parameters"]
        if p["name"] == "backend"
    )
    assert all(re.search(backend["schema"]["pattern"], b) for b in ("north", "south east"))
    assert not any(re.search(backend["schema"]["pattern"], b) for b in (" north", "a/b", "x\x00"))


def test_every_operation_declares_every_error_it_can_answer_500_included(admin_client):
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert {"400", "401", "403", "429", "500"} <= set(responses), (method, path)
            assert responses["500"]["content"] == error and "server_error" in responses["500"]["description"]
            if method == "post":
                assert {"413", "415", "422"} <= set(responses), (method, path)
    writes = ("runs/{id}/cancel/", "runs/{id}/cleanup/", "runs/{id}/waive/", "resources/{id}/waive/")
    for write in writes:
        operation = schema["paths"][f"/api/v1/events/{write}"]["post"]
        assert "If-Match" in {p["name"] for p in operation["parameters"]}, write
        assert "precondition_failed" in operation["responses"]["412"]["description"], write
    for listed in ("runs/", "resources/", "runs/{id}/resources/", "runs/{id}/log/", "modules/", "modules/log/"):
        operation = schema["paths"][f"/api/v1/events/{listed}"]["get"]
        assert "If-None-Match" in {p["name"] for p in operation["parameters"]}, listed
        assert "304" in operation["responses"] and "ETag" in operation["responses"]["200"]["headers"], listed


def test_the_schema_generates_without_warnings(tmp_path):
    # Fails on a warning such as an enum name collision (Run.status and Step.status both
    # want "StatusEnum"): SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"] names them.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))


@pytest.fixture
def ledger(db):
    """A run with a ledger row in every state and a lease; a running run with a log."""
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))
    run = make_run(status=RunStatus.ABORTED)
    step = make_step(run)
    for state in ResourceState.values:
        make_rows(step, [f"orc-{state}"], placeholder=False)
        Resource.objects.filter(ref=f"orc-{state}").update(state=state)
    make_lease_row(run)
    make_run(status=RunStatus.RUNNING).log.create(kind="run.started", detail={"by": "console"})
    return run


@pytest.fixture
def root_token(db):
    user = user_with(username="root")
    User.objects.filter(pk=user.pk).update(is_superuser=True)
    return issue(user)[1]


@pytest.fixture
def wsgi_keeps_the_test_connection():
    """Calls through the bare WSGI app keep the test's database connection open.

    Django closes old connections when a request starts and ends, which would close the
    one holding the test's transaction; its own test client switches that off the same way.
    """
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


def without_made_up_cursor(case):
    """A cursor is opaque: one the list did not give is refused (400), so none is made up."""
    if case.query:
        case.query.pop("cursor", None)
    return case


@pytest.fixture
def waits_pass_at_once(monkeypatch):
    """The feed's long-polls (`?wait=` up to 30 s) end at once, with nothing new."""
    from cleanup.api import waiting

    async def nothing_happens(after, limit, run, kinds, wait_s):
        return []

    monkeypatch.setattr(waiting, "wait_for_entries", nothing_happens)


@pytest.mark.slow
def test_every_get_answers_without_5xx_and_as_the_schema_says(
    ledger, root_token, wsgi_keeps_the_test_connection, waits_pass_at_once
):
    # The operations are walked here rather than with schemathesis' pytest plugin, whose
    # lazy fixture loader does not run under pytest 9.
    headers = {"Authorization": f"Token {root_token}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application, headers=headers)
    schema = schema.include(method="GET", path_regex="^/api/v1/events/")
    real_ids = {"/api/v1/events/resources/{id}/": Resource.objects.first().pk}
    walked = []
    for result in schema.get_all_operations():
        operation = result.ok()
        walked.append(operation.path)

        @given(case=operation.as_strategy().map(without_made_up_cursor))
        @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def conforms(case):
            case.call_and_validate(headers=headers)

        conforms()
        if "{id}" in operation.path:
            # Generated ids seldom name a row that exists: one call on a real one.
            case = operation.Case(path_parameters={"id": real_ids.get(operation.path, ledger.pk)})
            assert case.call_and_validate(headers=headers).status_code == 200, operation.path
    assert sorted(walked) == sorted(p for p in PATHS if p not in POSTS)
