"""Every error under the API is one envelope, ``{"code", "detail", "errors"?}``, with a stable code.

A console branches on ``code``: each test here provokes one code through the API as a console
would, and checks the whole envelope, not only the status.
"""

import json
import re
from pathlib import Path

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from cleanup import outages, registry
from cleanup.api.errors import CODES, ApiError
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


def envelope(response, status, code):
    """The envelope of an error answer, checked: JSON, the status, the code and a sentence."""
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["detail"], str) and body["detail"], body
    assert set(body) <= {"code", "detail", "errors"}, body
    return body


@pytest.fixture
def api():
    return api_as(*EVERY)


@pytest.fixture
def action():
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))


def test_an_unknown_run_a_route_and_a_module_answer_not_found(api):
    for path in (f"{API}runs/999999/", f"{API}no/such/route/", f"{API}modules/atlantis/log/"):
        assert envelope(api.get(path), 404, "not_found") == {"code": "not_found", "detail": "Not found."}, path


def test_without_credentials_or_with_a_wrong_token_it_is_not_authenticated():
    body = envelope(APIClient().get(f"{API}runs/"), 401, "not_authenticated")
    assert "errors" not in body
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    envelope(client.get(f"{API}runs/"), 401, "not_authenticated")


def test_without_the_permission_or_staff_it_is_permission_denied():
    envelope(api_as("view_run").post(f"{API}runs/", {}, format="json"), 403, "permission_denied")
    envelope(api_as("view_run", staff=False, username="guest").get(f"{API}runs/"), 403, "permission_denied")


def test_a_method_the_endpoint_lacks_is_method_not_allowed_with_allow(api):
    response = api.delete(f"{API}runs/")
    envelope(response, 405, "method_not_allowed")
    assert "POST" in response["Allow"]


def test_asking_for_html_is_not_acceptable(api):
    envelope(api.get(f"{API}runs/", HTTP_ACCEPT="text/html"), 406, "not_acceptable")


def test_a_form_body_is_an_unsupported_media_type(api):
    response = api.generic("POST", f"{API}runs/", "name=raid", content_type="text/plain")
    envelope(response, 415, "unsupported_media_type")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_a_body_over_the_limit_is_payload_too_large(api):
    big = json.dumps({"name": "raid", "steps": [{"action": "core.wait", "params": {"x": "y" * 2000}}]})
    envelope(api.generic("POST", f"{API}runs/", big, content_type="application/json"), 413, "payload_too_large")


def test_a_body_that_is_not_json_is_a_parse_error(api):
    body = envelope(api.generic("POST", f"{API}runs/", "{nope", content_type="application/json"), 400, "parse_error")
    assert "JSON parse error" in body["detail"]


def test_a_bad_field_is_invalid_naming_the_field_in_errors_and_in_the_detail(api):
    response = api.post(f"{API}runs/", {"name": "raid", "steps": [{"action": "no.such"}]}, format="json")
    body = envelope(response, 400, "invalid")
    assert list(body["errors"]) == ["steps[0].action"]
    assert all(isinstance(m, str) for m in body["errors"]["steps[0].action"])
    assert body["detail"].startswith("steps[0].action: ")


def test_nested_serializer_errors_are_flattened_to_field_names(api):
    body = envelope(api.post(f"{API}runs/1/cancel/", {"cleanup": "yes"}, format="json"), 400, "invalid")
    assert set(body["errors"]) == {"cleanup"}


def test_a_cancel_of_an_ended_run_is_run_ended(api):
    run = make_run(status=RunStatus.COMPLETED)
    body = envelope(api.post(f"{API}runs/{run.pk}/cancel/", {}, format="json"), 409, "run_ended")
    assert "already completed" in body["detail"]


def test_a_cleanup_of_a_running_run_is_run_in_flight_and_of_one_owing_nothing_nothing_to_clean(api, action):
    running = make_run(status=RunStatus.RUNNING)
    envelope(api.post(f"{API}runs/{running.pk}/cleanup/", {}, format="json"), 409, "run_in_flight")
    settled = make_run(status=RunStatus.COMPLETED)
    envelope(api.post(f"{API}runs/{settled.pk}/cleanup/", {}, format="json"), 409, "nothing_to_clean")


def test_a_waiver_of_a_resolved_row_is_already_resolved(api, action):
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    row = Resource.objects.get()
    Resource.objects.update(state="reverted")
    envelope(api.post(f"{API}resources/{row.pk}/waive/", {"reason": "gone"}, format="json"), 409, "already_resolved")


def test_marking_a_module_down_twice_is_already_down_and_up_twice_already_up(api, action):
    outages.mark_down("test", by="alice", reason="deploy")
    envelope(api.post(f"{API}modules/test/down/", {"reason": "again"}, format="json"), 409, "already_down")
    envelope(
        api.post(f"{API}modules/test/backends/north/up/", {}, format="json"), 409, "already_up"
    )  # never seen: up already


def test_the_old_prefix_answers_the_same_envelope(api):
    envelope(api.get("/api/events/runs/999999/"), 404, "not_found")


@pytest.mark.parametrize("debug", [False, True])
def test_a_server_error_is_the_envelope_whatever_debug(api, settings, debug, monkeypatch):
    settings.DEBUG = debug
    from cleanup.api import views

    def broken(*args, **kwargs):
        raise RuntimeError("the database fell over")

    monkeypatch.setattr(views, "runs", broken)
    api.raise_request_exception = False
    body = envelope(api.get(f"{API}runs/"), 500, "server_error")
    assert "fell over" not in body["detail"]


def test_an_api_error_must_carry_a_known_code():
    with pytest.raises(ValueError, match="not one of the API's error codes"):
        ApiError(409, "no_such_code", "?")
    with pytest.raises(ValueError, match="is a 409"):
        ApiError(400, "run_ended", "?")
    error = ApiError(429, "quota_exceeded", "20 runs are running", headers={"Retry-After": "30"})
    assert (error.status_code, error.code, error.headers) == (429, "quota_exceeded", {"Retry-After": "30"})


def test_docs_api_lists_every_code_and_no_other():
    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    section = text.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", section, flags=re.M)
    assert listed == [(code, str(status)) for code, (status, _) in CODES.items()]


def test_a_throttled_request_is_the_envelope_with_retry_after(api, monkeypatch):
    from rest_framework.throttling import BaseThrottle

    from cleanup.api import views

    class Shut(BaseThrottle):
        def allow_request(self, request, view):
            return False

        def wait(self):
            return 30

    monkeypatch.setattr(views.RunListView, "throttle_classes", [Shut])
    response = api.get(f"{API}runs/")
    body = envelope(response, 429, "throttled")
    assert response["Retry-After"] == "30" and "30 seconds" in body["detail"]


def test_an_api_errors_headers_reach_the_answer(api, monkeypatch):
    from cleanup.api import views

    def full(*args, **kwargs):
        raise ApiError(
            429, "quota_exceeded", "20 runs are running: the most a user may have", headers={"Retry-After": "60"}
        )

    monkeypatch.setattr(views, "start_run", full)
    response = api.post(f"{API}runs/", {"name": "raid", "steps": []}, format="json")
    assert envelope(response, 429, "quota_exceeded")["detail"].startswith("20 runs are running")
    assert response["Retry-After"] == "60"
