"""``/api/v1/events/`` is the API; the old ``/api/events/`` answers the same, marked deprecated."""

from importlib.metadata import version

import pytest
from django.urls import reverse

from cleanup.models import RunStatus
from tests.fakes import make_run
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db

SUCCESSOR = 'rel="successor-version"'


@pytest.fixture
def api():
    return api_as("view_run", "add_run", "change_run")


def test_the_old_prefix_answers_the_same_as_v1_and_says_it_is_deprecated(api):
    run = make_run(status=RunStatus.COMPLETED, name="raid")
    current = api.get("/api/v1/events/runs/?status=completed")
    old = api.get("/api/events/runs/?status=completed")
    assert (old.status_code, old.json()) == (current.status_code, current.json()) == (200, current.json())
    assert [r["id"] for r in current.json()["results"]] == [run.pk]
    assert "Deprecation" not in current and SUCCESSOR not in current.get("Link", "")
    assert old["Deprecation"].startswith("@") and old["Deprecation"][1:].isdecimal()
    assert old["Link"] == f"<http://testserver/api/v1/events/runs/?status=completed>; {SUCCESSOR}"


def test_errors_and_writes_under_the_old_prefix_are_marked_too(api):
    missing = api.get("/api/events/runs/999999/")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert missing["Link"] == f"<http://testserver/api/v1/events/runs/999999/>; {SUCCESSOR}"
    unrouted = api.get("/api/events/nowhere/")
    assert unrouted.status_code == 404 and unrouted["Deprecation"]
    started = api.post("/api/events/runs/", {"name": "raid", "steps": []}, format="json")
    assert started.status_code in (201, 400) and started["Deprecation"]


def test_urls_the_app_names_are_v1():
    assert reverse("events-run", args=[7]) == "/api/v1/events/runs/7/"


def test_the_schema_documents_v1_only_and_carries_the_package_version(admin_client):
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert schema["info"]["version"] == version("eventsite") == "0.1.0"
    assert schema["paths"] and all(path.startswith("/api/v1/events/") for path in schema["paths"])
    # Operation ids as before the version, so a regenerated client keeps its function names.
    assert schema["paths"]["/api/v1/events/runs/"]["get"]["operationId"] == "events_runs_list"


def test_a_request_to_a_refused_host_under_the_old_prefix_still_answers_the_envelope(client):
    response = client.get("/api/events/runs/", HTTP_HOST="evil.example")
    assert response.status_code == 400 and response.json()["code"] == "invalid"
    assert response["Link"] == f"</api/v1/events/runs/>; {SUCCESSOR}"


def test_the_version_is_read_from_pyproject_when_the_package_is_not_installed(monkeypatch):
    from importlib.metadata import PackageNotFoundError

    from eventsite import settings as site_settings

    def not_installed(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(site_settings, "package_version", not_installed)
    assert site_settings._package_version() == version("eventsite")
