"""Property tests: no input to a write endpoint answers 5xx, and the run validator refuses
anything it cannot store with its own error, never another exception.

schemathesis generates bodies for every POST of the schema and checks each answer against
it (status documented, body of the documented shape); hypothesis feeds `validate_spec`
arbitrary JSON, deep, huge, non-finite and surrogate-laden included.
"""

import math

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanup import registry, validation
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


@pytest.mark.slow
@pytest.mark.django_db
def test_every_post_answers_without_5xx_and_as_the_schema_says(ledger, root_token, wsgi_keeps_the_test_connection):  # noqa: F811
    # No module may reach a real shard from generated steps.
    registry.unregister_module("sandbox")
    headers = {"Authorization": f"Token {root_token}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application, headers=headers)
    walked = []
    for result in schema.include(method="POST", path_regex="^/api/v1/events/").get_all_operations():
        operation = result.ok()
        walked.append(operation.path)

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def conforms(case):
            if "{id}" in operation.path and case.path_parameters.get("id", 0) % 2:  # noqa: B023 (called at once)
                case.path_parameters["id"] = ledger.pk  # half the examples on a row that exists
            # The engine refuses more than a schema can say (a registered action, a NUL, a
            # blank reason), so a schema-valid body may be 400: every other check holds.
            case.call_and_validate(headers=headers, excluded_checks=[schemathesis.checks.positive_data_acceptance])

        conforms()
    assert sorted(walked) == sorted(WRITES)


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
