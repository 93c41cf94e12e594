"""Property tests: no input to a write endpoint answers 5xx, none the schema calls valid is
refused, and the run validator refuses anything it cannot store with its own error, never
another exception.

schemathesis generates bodies for every POST of the schema and checks each answer against
it (status documented, body of the documented shape, a valid request not answered 400:
`positive_data_acceptance`), and requests the schema calls invalid, each of which must be
refused (`negative_data_rejection`); hypothesis feeds `validate_spec`
arbitrary JSON, deep, huge, non-finite and surrogate-laden included.
"""

import math
import re
import uuid
from datetime import timedelta

import pytest
import schemathesis
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import PositiveDataAcceptanceConfig

from cleanup import registry, validation
from cleanup.models import Resource
from cleanup.runner import RunSpecError, validate_spec
from eventsite.wsgi import application
from tests.fakes import FakeAction, FakeLease
from tests.test_api_schema import ledger, root_token, wsgi_keeps_the_test_connection  # noqa: F401 (fixtures)

WRITES = {
    "/api/v1/events/runs/",
    "/api/v1/events/runs/{id}/cancel/",
    "/api/v1/events/runs/{id}/cleanup/",
    "/api/v1/events/runs/{id}/waive/",
    "/api/v1/events/resources/{id}/waive/",
    "/api/v1/events/modules/{name}/down/",
    "/api/v1/events/modules/{name}/up/",
    "/api/v1/events/modules/{name}/reconcile/",
    "/api/v1/events/modules/{name}/backends/{backend}/down/",
    "/api/v1/events/modules/{name}/backends/{backend}/up/",
    "/api/v1/events/modules/{name}/backends/{backend}/reconcile/",
}


def made_valid_for_now(case, run):
    """What the schema cannot say is made true of a generated case, each for its stated reason:
    half the ids name the ledger's run or row; a waiver names rows of that run (ids of other
    rows are refused, naming them); a hold ends in the future (``until``, as its description
    says); each request carries a key of its own (a key sent again with another body is 422)."""
    if "{id}" in case.operation.path and case.path_parameters.get("id", 0) % 2:
        case.path_parameters["id"] = run.pk
    body = case.body if isinstance(case.body, dict) else {}
    if isinstance(body.get("rows"), list):
        real = list(Resource.objects.filter(run=run).values_list("id", flat=True))
        body["rows"] = real[: len(body["rows"])]
    if body.get("until") is not None:
        body["until"] = (timezone.now() + timedelta(hours=1)).isoformat()
    if case.headers and "Idempotency-Key" in case.headers:
        case.headers["Idempotency-Key"] = str(uuid.uuid4())
    return case


def refused_for_what_only_a_module_knows(case, response):
    """A run's steps name actions whose registration and params only the modules can check
    (the schema says so in prose): a 400 on a start whose every field at fault is a step's
    action or params is the engine's own check, not a valid request refused."""
    if case.operation.path != "/api/v1/events/runs/" or response.status_code != 400:
        return False
    fields = response.json().get("errors", {})
    return bool(fields) and all(re.match(r"^steps\[\d+\]\.(action|params)", field) for field in fields)


@pytest.mark.slow
@pytest.mark.django_db
def test_no_post_answers_5xx_or_refuses_a_valid_request(ledger, root_token, wsgi_keeps_the_test_connection):  # noqa: F811
    # No module may reach a real shard from generated steps.
    registry.unregister_module("sandbox")
    headers = {"Authorization": f"Token {root_token}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application, headers=headers)
    # A stale If-Match (412) answers the object's state, as a 409 does: not the request's data.
    accepted = [*schema.config.checks.positive_data_acceptance.expected_statuses, "412"]
    schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(expected_statuses=accepted)
    walked = []
    for result in schema.include(method="POST", path_regex="^/api/v1/events/").get_all_operations():
        operation = result.ok()
        walked.append(operation.path)

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def conforms(case):
            case = made_valid_for_now(case, ledger)
            response = case.call(headers=headers)
            if refused_for_what_only_a_module_knows(case, response):
                case.validate_response(
                    response, headers=headers, excluded_checks=[schemathesis.checks.positive_data_acceptance]
                )
                return
            # Every check, a schema-valid request refused (positive_data_acceptance) included.
            case.validate_response(response, headers=headers)

        conforms()
    assert sorted(walked) == sorted(WRITES)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.django_db
def test_every_request_the_schema_calls_invalid_is_refused(ledger, root_token, wsgi_keeps_the_test_connection):  # noqa: F811
    # The other way round: what the schema refuses (a blank reason, no steps, a UTF-8 key, a
    # backend's name with a '/' or spaces at its ends), the server refuses too, never with a 5xx.
    registry.unregister_module("sandbox")
    headers = {"Authorization": f"Token {root_token}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application, headers=headers)
    checks = [schemathesis.checks.negative_data_rejection, schemathesis.checks.not_a_server_error]
    walked = []
    for result in schema.include(path_regex="^/api/v1/events/").get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/changes/"):
            continue  # its long-poll and stream are the feed's own tests'

        @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def refused(case):
            case.validate_response(case.call(headers=headers), headers=headers, checks=checks)

        try:
            refused()
        except Unsatisfiable:
            continue  # nothing of it can be invalid (no parameter, no body): modules/, summary/
        walked.append(operation.path)
    assert set(WRITES) <= set(walked)


# -- the validator ---------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.sampled_from(["\x00", "\ud800", "a\udfffb", "x" * 300])
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20
)


@st.composite
def deep(draw):
    value = draw(json_values)
    for _ in range(draw(st.integers(min_value=0, max_value=200))):
        value = {"x": value} if draw(st.booleans()) else [value]
    return value


actions = st.sampled_from(["core.wait", "core.lease", "test.spawn", "nope.spawn", "sandbox.spawn"]) | json_values
params = (
    st.fixed_dictionaries(
        {},
        optional={
            "seconds": json_values,
            "lease": st.sampled_from(["test.rate", "sandbox.spawner_rate"]) | json_values,
            "target": json_values,
            "value": json_values,
            "creature": json_values,
            "count": json_values,
            "at": json_values,
        },
    )
    | deep()
)
steps = (
    st.lists(
        st.fixed_dictionaries({"action": actions}, optional={"params": params, "extra": json_values}) | json_values,
        max_size=5,
    )
    | json_values
)


SPAWN = FakeAction(validate=lambda params: None)
RATE = FakeLease()


def storable(value):
    return validation.json_problem(value) is None


@given(name=st.text() | json_values, steps=steps)
@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_the_validator_answers_a_clean_spec_or_its_own_error_for_any_json(name, steps):
    registry.register_action(SPAWN)  # the same objects each example: registering is idempotent
    registry.register_lease(RATE)
    try:
        cleaned = validate_spec(name, steps)
    except RunSpecError as exc:
        assert exc.errors and all(isinstance(k, str) and isinstance(v, str) for k, v in exc.errors.items())
        assert all(storable(k) and storable(v) for k, v in exc.errors.items()), "a message PostgreSQL cannot store"
        return
    assert isinstance(name, str) and name.strip() and storable(name)
    assert 1 <= len(cleaned) <= validation.limit("EVENT_MAX_STEPS")
    for step in cleaned:
        assert storable(step["params"])
        assert validation.params_error(step["params"]) is None
        assert not any(isinstance(v, float) and not math.isfinite(v) for v in step["params"].values())
