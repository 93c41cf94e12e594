"""Who may call the events API: staff only, by token or session, each endpoint behind its permission.

The helpers here (`user_with`, `api_as`) are shared by the other `test_api_*` files.
"""

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from cleanup import registry
from cleanup.api.tokens import issue
from cleanup.models import Resource, Run, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

API = "/api/v1/events/"
EVERY_PERMISSION = ("view_run", "add_run", "change_run", "view_resource", "view_runlog", "cleanup_run")


def user_with(*codenames, staff=True, username="console"):
    user = User.objects.create_user(username, password="pw-123456789", is_staff=staff)
    perms = Permission.objects.filter(content_type__app_label="cleanup", codename__in=codenames)
    assert perms.count() == len(codenames), f"unknown permission among {codenames}"
    user.user_permissions.add(*perms)
    return user


def api_as(*codenames, staff=True, username="console"):
    """A client that authenticates as the console does, with a token."""
    _, key = issue(user_with(*codenames, staff=staff, username=username))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def ended_run():
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))
    run = make_run(status=RunStatus.ABORTED, name="broken raid")
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.update(state="failed", revert_attempts=3, last_error="shard said 503")
    return run


def endpoints(run, row, running=None, other=None):
    """(method, path, body, the permissions it needs) for every endpoint; `running` is cancelled,
    the row id `other` (else `row`) waived with the run's others."""
    return [
        ("get", f"{API}runs/", None, ["view_run"]),
        (
            "post",
            f"{API}runs/",
            {"name": "raid", "steps": [{"action": "core.wait", "params": {"seconds": 1}}]},
            ["add_run"],
        ),
        ("get", f"{API}runs/{run.pk}/", None, ["view_run"]),
        ("post", f"{API}runs/{(running or run).pk}/cancel/", {}, ["change_run"]),
        ("post", f"{API}runs/{run.pk}/cleanup/", {}, ["cleanup_run"]),
        ("get", f"{API}runs/{run.pk}/cleanup-plan/", None, ["view_run", "view_resource"]),
        ("get", f"{API}runs/{run.pk}/resources/", None, ["view_resource"]),
        ("get", f"{API}runs/{run.pk}/log/", None, ["view_runlog"]),
        ("get", f"{API}resources/", None, ["view_resource"]),
        ("get", f"{API}resources/{row.pk}/", None, ["view_resource"]),
        ("post", f"{API}resources/{row.pk}/waive/", {"reason": "gone by hand"}, ["cleanup_run"]),
        ("post", f"{API}modules/test/reconcile/", {}, ["cleanup_run"]),
        ("get", f"{API}summary/", None, ["view_run", "view_resource"]),
        ("post", f"{API}runs/{run.pk}/waive/", {"reason": "gone by hand", "rows": [other or row.pk]}, ["cleanup_run"]),
    ]


def call(client, method, path, body):
    return getattr(client, method)(path, body, format="json") if method == "post" else client.get(path)


def test_it_answers_401_without_credentials_and_asks_for_a_token(ended_run):
    row = Resource.objects.get()
    for method, path, body, _ in endpoints(ended_run, row):
        response = call(APIClient(), method, path, body)
        assert response.status_code == 401, (method, path)
        assert response["WWW-Authenticate"] == "Token"
    assert Run.objects.count() == 1 and Resource.objects.get().state == "failed"


def test_it_answers_401_to_an_unknown_token():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert client.get(f"{API}runs/").status_code == 401


def test_a_token_authenticates_the_console(ended_run):
    response = api_as("view_run").get(f"{API}runs/")
    assert response.status_code == 200
    assert [r["name"] for r in response.json()["results"]] == ["broken raid"]


def test_a_session_authenticates_staff(ended_run):
    user_with("view_run", username="operator")
    client = APIClient()
    assert client.login(username="operator", password="pw-123456789")
    assert client.get(f"{API}runs/{ended_run.pk}/").json()["name"] == "broken raid"


def test_a_user_who_is_not_staff_gets_403_whatever_permissions_they_hold(ended_run):
    client = api_as(*EVERY_PERMISSION, staff=False)
    row = Resource.objects.get()
    for method, path, body, _ in endpoints(ended_run, row):
        assert call(client, method, path, body).status_code == 403, (method, path)
    assert Resource.objects.get().state == "failed"


def test_a_deactivated_users_token_is_refused(ended_run):
    client = api_as(*EVERY_PERMISSION)
    User.objects.update(is_active=False)
    assert client.get(f"{API}runs/").status_code == 401


def test_each_endpoint_needs_its_permission(ended_run):
    row = Resource.objects.get()
    other = make_rows(make_step(ended_run), ["orc-2"], placeholder=False)[0].pk
    running = make_run(status=RunStatus.RUNNING, name="live raid")
    for index, (method, path, body, needed) in enumerate(endpoints(ended_run, row, running, other)):
        others = [p for p in EVERY_PERMISSION if p not in needed]
        for missing in needed:
            held = [p for p in needed if p != missing] + others
            denied = call(api_as(*held, username=f"without-{missing}-{index}"), method, path, body)
            assert denied.status_code == 403, (method, path, missing)
            assert "permission" in denied.json()["detail"]
        allowed = call(api_as(*needed, username=f"with-{index}"), method, path, body)
        assert allowed.status_code < 400, (method, path, allowed.status_code, allowed.content)


def test_refused_writes_change_nothing(ended_run):
    client = api_as("view_run", "view_resource")
    client.post(
        f"{API}runs/", {"name": "raid", "steps": [{"action": "core.wait", "params": {"seconds": 1}}]}, format="json"
    )
    client.post(f"{API}runs/{ended_run.pk}/cleanup/", format="json")
    client.post(f"{API}resources/{Resource.objects.get().pk}/waive/", {"reason": "x"}, format="json")
    assert Run.objects.count() == 1
    assert Resource.objects.get().revert_attempts == 3 and Resource.objects.get().state == "failed"
    assert not ended_run.log.exists()


def test_answers_are_json_even_to_a_browser(ended_run):
    client = api_as("view_run")
    for path, code in ((f"{API}runs/", 200), (f"{API}runs/999999/", 404), (f"{API}no-such-thing/", 404)):
        response = client.get(path, HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
        assert response.status_code == code
        assert response["Content-Type"] == "application/json"
        response.json()
