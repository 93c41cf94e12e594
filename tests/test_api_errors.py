"""No input reaches a 500 under /api/, and every error there is JSON, whatever DEBUG is."""

import json

import pytest
from django.test import override_settings

from cleanup.models import Resource, Run, RunStatus
from tests.fakes import make_rows, make_run, make_step
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db

API = "/api/v1/events/"


@pytest.fixture
def api():
    return api_as("view_run", "add_run", "change_run", "cleanup_run", "view_resource", "view_runlog")


@pytest.fixture
def run():
    run = make_run(status=RunStatus.RUNNING)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    return run


def post_raw(api, path, raw, content_type="application/json"):
    return api.generic("POST", path, raw, content_type=content_type)


def assert_json_error(response, status):
    """The error's envelope, checked: JSON ``{"code", "detail"}``; its field messages when it has them."""
    assert response.status_code == status, (response.status_code, response.content[:200])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body.get("code"), str) and isinstance(body.get("detail"), str), body
    return body.get("errors", body)


def endpoints(run):
    row = Resource.objects.first()
    return [
        f"{API}runs/",
        f"{API}runs/{run.pk}/",
        f"{API}runs/{run.pk}/cancel/",
        f"{API}runs/{run.pk}/cleanup/",
        f"{API}runs/{run.pk}/cleanup-plan/",
        f"{API}runs/{run.pk}/resources/",
        f"{API}runs/{run.pk}/log/",
        f"{API}resources/",
        f"{API}resources/{row.pk}/",
        f"{API}resources/{row.pk}/waive/",
        f"{API}modules/test/reconcile/",
        f"{API}summary/",
    ]


@pytest.mark.parametrize(
    "method", ["DISPATCH", "LIST", "INITIAL", "RETRIEVE", "GET_QUERYSET", "PUT", "PATCH", "DELETE", "FROB"]
)
def test_it_answers_405_to_a_method_no_endpoint_has(api, run, method):
    for path in endpoints(run):
        response = api.generic(method, path)
        body = assert_json_error(response, 405)
        assert "detail" in body, path


def test_it_refuses_a_body_nested_hundreds_of_levels_deep(api):
    for depth in (300, 100_000):
        raw = '{"name": "raid", "steps": [{"action": "core.wait", "params": ' + '{"a": ' * depth + "1" + "}" * depth
        raw += "}]}"
        body = assert_json_error(post_raw(api, f"{API}runs/", raw), 400)
        assert any("nests deeper" in str(message) for message in body.values()), body
    assert not Run.objects.exists()


def test_it_names_params_nested_past_the_engines_limit(api):
    params = 1
    for _ in range(40):
        params = {"a": params}
    body = assert_json_error(
        api.post(f"{API}runs/", {"name": "raid", "steps": [{"action": "core.wait", "params": params}]}, format="json"),
        400,
    )
    ((field, messages),) = body.items()
    assert field == "steps[0].params" + ".a" * 32 and messages == ["nests deeper than 32 levels"]


@pytest.mark.parametrize(
    "raw, field",
    [
        (
            '{"name": "raid", "steps": [{"action": "core.wait", "params": {"seconds": 1e400}}]}',
            "steps[0].params.seconds",
        ),
        ('{"name": "raid \\ud800", "steps": [{"action": "core.wait", "params": {"seconds": 1}}]}', "name"),
        (
            '{"name": "raid", "steps": [{"action": "core.wait", "params": {"x": "\\udfff", "seconds": 1}}]}',
            "steps[0].params.x",
        ),
        (
            '{"name": "raid", "steps": [{"action": "core.wait", "params": {"x": "a\\u0000", "seconds": 1}}]}',
            "steps[0].params.x",
        ),
    ],
)
def test_it_refuses_values_postgresql_cannot_store_naming_the_field(api, raw, field):
    body = assert_json_error(post_raw(api, f"{API}runs/", raw), 400)
    assert field in body, body
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "raw", ['{"name": NaN, "steps": []}', '{"name": "raid", "steps": [' + "9" * 5000 + "]}", b'{"name": "\xff"}']
)
def test_it_answers_json_400_to_a_body_it_cannot_parse(api, raw):
    body = assert_json_error(post_raw(api, f"{API}runs/", raw), 400)
    assert "JSON parse error" in body["detail"]


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_it_answers_json_413_to_an_over_large_body(api, run):
    big = json.dumps({"name": "raid", "steps": [{"action": "core.wait", "params": {"x": "y" * 2000}}]})
    assert assert_json_error(post_raw(api, f"{API}runs/", big), 413) == {
        "code": "payload_too_large",
        "detail": "The request body is too large.",
    }
    form = "reason=" + "x" * 2000
    response = post_raw(
        api,
        f"{API}resources/{Resource.objects.get().pk}/waive/",
        form,
        content_type="application/x-www-form-urlencoded",
    )
    assert_json_error(response, 413)


def test_it_answers_413_for_a_body_without_a_content_length(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    from cleanup.api.errors import PayloadTooLarge
    from cleanup.api.parsers import BoundedJSONParser

    class Stream:
        def read(self, size=-1):
            return b"[" + b"1," * 200 + b"1]"

    with pytest.raises(PayloadTooLarge):
        BoundedJSONParser().parse(Stream(), parser_context={})


@pytest.mark.parametrize("debug", [True, False])
def test_it_answers_every_404_as_json_in_one_wording_whatever_debug(api, debug):
    with override_settings(DEBUG=debug):
        for method, path in [
            ("GET", f"{API}no-such-thing/"),
            ("GET", "/api/nothing-here"),
            ("GET", f"{API}runs/999999/"),
            ("POST", f"{API}runs/999999/cancel/"),
            ("POST", f"{API}runs/999999/cleanup/"),
            ("GET", f"{API}runs/999999/log/"),
            ("GET", f"{API}runs/999999/cleanup-plan/"),
            ("POST", f"{API}resources/999999/waive/"),
            ("POST", f"{API}modules/atlantis/reconcile/"),
        ]:
            body = {"reason": "x"} if "waive" in path else {}
            response = api.generic(method, path, json.dumps(body), content_type="application/json")
            assert_json_error(response, 404)
            assert response.json() == {"code": "not_found", "detail": "Not found."}, path


@pytest.mark.parametrize(
    "path, body",
    [
        ("runs/{run}/cancel/", {"cleanup": True, "force": True}),
        ("runs/{run}/cleanup/", {"reset": True, "now": True}),
        ("runs/{run}/waive/", {"reason": "gone", "rows": "all", "by": "x"}),
        ("resources/{row}/waive/", {"reason": "gone", "by": "x"}),
        ("modules/test/reconcile/", {"restarted": False, "all": True}),
    ],
)
def test_every_write_endpoint_refuses_unknown_fields(api, run, path, body):
    url = API + path.format(run=run.pk, row=Resource.objects.get().pk)
    errors = assert_json_error(api.post(url, body, format="json"), 400)
    unknown = sorted(set(body) - {"cleanup", "reason", "restarted", "reset", "rows"})
    assert errors == {field: ["unknown field"] for field in unknown}
    assert Run.objects.get().status == RunStatus.RUNNING
    assert Resource.objects.get().state == "live"


def test_a_reason_must_be_a_string(api, run):
    row = Resource.objects.get()
    errors = assert_json_error(api.post(f"{API}resources/{row.pk}/waive/", {"reason": 5}, format="json"), 400)
    assert errors == {"reason": ["must be a string, not a number"]}
    errors = assert_json_error(api.post(f"{API}resources/{row.pk}/waive/", {"reason": "a\x00b"}, format="json"), 400)
    assert "NUL" in errors["reason"][0]
    row.refresh_from_db()
    assert row.state == "live"


def test_a_name_of_the_wrong_type_is_refused_for_its_type(api):
    errors = assert_json_error(
        api.post(
            f"{API}runs/", {"name": 5, "steps": [{"action": "core.wait", "params": {"seconds": 1}}]}, format="json"
        ),
        400,
    )
    assert errors == {"name": ["a name must be a string, not a number"]}


def test_options_describes_the_input_of_post(api):
    response = api.options(f"{API}runs/")
    assert response.status_code == 200
    post = response.json()["actions"]["POST"]
    assert set(post) == {"name", "steps"}
    assert post["name"]["max_length"] == 200


def test_django_s_own_permission_denied_is_a_403_envelope_not_a_crash():
    # A view (or a helper it calls) may raise Django's PermissionDenied, which has no
    # ``detail``: it is answered as DRF's, in the envelope, with its message.
    from django.core.exceptions import PermissionDenied

    from cleanup.api.errors import exception_handler

    response = exception_handler(PermissionDenied("only the run's starter may do that"), {})
    assert response.status_code == 403
    assert response.data == {"code": "permission_denied", "detail": "only the run's starter may do that"}
