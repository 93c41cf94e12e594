"""Permission before work, one rule for every door (issue 20, item 2).

A refused admin request makes no query of the app's tables and no module call; a run's
page shows its rows, plan and live values only with `view_resource` and its log only with
`view_runlog`, as the API does.
"""

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup import registry
from cleanup.models import ModuleHealth, Resource, RunLog, RunStatus
from tests.fakes import FakeAction, FakeLease, Scripted, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


class CountingLease(FakeLease):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.reads = 0

    def read(self, *, target):
        self.reads += 1
        return {"ok": True, "value": 5}


@pytest.fixture
def lease():
    entry = CountingLease(values={"camp": 5})
    registry.register_lease(entry)
    return entry


@pytest.fixture
def run_with_lease(lease):
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    run = make_run(status=RunStatus.COMPLETED, name="festival", cleanup_status="incomplete")
    make_lease_row(run)
    make_rows(make_step(run), ["orc-1"])
    Resource.objects.filter(ref="orc-1").update(state="failed", last_error="SECRET-ERROR the shard said 503")
    RunLog.objects.create(run=run, kind="cleanup.failed", detail={"error": "LOG-ENTRY-TEXT"})
    return run


def staff_with(client, *codenames, name="staffer"):
    user = User.objects.create_user(name, password="pw-123456789", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="cleanup", codename__in=codenames))
    client.force_login(user)
    return client


def app_queries(captured):
    """The queries of a request that touched the app's own tables (not auth, sessions)."""
    return [q["sql"] for q in captured.captured_queries if "cleanup_" in q["sql"]]


def admin_pages(run):
    row = Resource.objects.filter(run=run).first()
    return [
        reverse("admin:cleanup_run_change", args=[run.pk]) + "?live=1",
        reverse("admin:cleanup_run_changelist"),
        reverse("admin:cleanup_run_history", args=[run.pk]),
        reverse("admin:cleanup_resource_changelist"),
        reverse("admin:cleanup_resource_change", args=[row.pk]),
        reverse("admin:cleanup_step_changelist"),
        reverse("admin:cleanup_runlog_changelist"),
        reverse("admin:cleanup_modulehealth_changelist"),
        reverse("admin:cleanup_moduleevent_changelist"),
        reverse("admin:cleanup_alert_changelist"),
    ]


def test_a_refused_admin_request_makes_no_module_call_and_no_query_of_the_apps_tables(client, lease, run_with_lease):
    staff_with(client)  # staff, no permission at all
    for url in admin_pages(run_with_lease):
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 403, url
        assert app_queries(captured) == [], url
    assert lease.reads == 0
    # The module health page would have written a row per registered module: nothing was written.
    assert not ModuleHealth.objects.exists()


def test_a_refused_action_post_makes_no_module_call(client, lease, run_with_lease):
    staff_with(client)
    url = reverse("admin:cleanup_run_changelist")
    with CaptureQueriesContext(connection) as captured:
        response = client.post(url, {"action": "clean_up", "_selected_action": [run_with_lease.pk], "apply": "1"})
    assert response.status_code == 403
    assert app_queries(captured) == []
    assert lease.reads == 0 and lease.restores == []


def test_a_user_with_only_view_run_sees_the_run_and_its_steps_but_no_rows_plan_log_or_live_values(
    client, lease, run_with_lease
):
    staff_with(client, "view_run")
    page = client.get(reverse("admin:cleanup_run_change", args=[run_with_lease.pk]) + "?live=1")
    assert page.status_code == 200
    text = page.content.decode()
    assert "festival" in text and 'id="steps"' in text
    assert 'id="rows"' not in text and 'id="plan"' not in text and 'id="log"' not in text
    assert 'id="timeline"' not in text
    assert "SECRET-ERROR" not in text and "LOG-ENTRY-TEXT" not in text
    assert "cleanup.view_resource" in text and "cleanup.view_runlog" in text
    assert lease.reads == 0


def test_view_resource_shows_rows_plan_and_live_values_but_not_the_log(client, lease, run_with_lease):
    staff_with(client, "view_run", "view_resource")
    text = client.get(reverse("admin:cleanup_run_change", args=[run_with_lease.pk]) + "?live=1").content.decode()
    assert 'id="rows"' in text and 'id="plan"' in text and "SECRET-ERROR" in text
    assert "live now: <strong>5</strong>" in text and lease.reads == 1
    assert 'id="log"' not in text and "LOG-ENTRY-TEXT" not in text


def test_view_runlog_shows_the_log_but_not_the_rows(client, lease, run_with_lease):
    staff_with(client, "view_run", "view_runlog")
    text = client.get(reverse("admin:cleanup_run_change", args=[run_with_lease.pk]) + "?live=1").content.decode()
    assert 'id="log"' in text and "LOG-ENTRY-TEXT" in text
    assert 'id="rows"' not in text and "SECRET-ERROR" not in text
    assert lease.reads == 0


def test_all_three_show_everything_with_the_timeline(client, lease, run_with_lease):
    staff_with(client, "view_run", "view_resource", "view_runlog")
    text = client.get(reverse("admin:cleanup_run_change", args=[run_with_lease.pk])).content.decode()
    assert all(f'id="{part}"' in text for part in ("timeline", "rows", "plan", "steps", "log"))
    assert lease.reads == 0  # no ?live=1, no read


@pytest.mark.parametrize(
    "page",
    [
        "admin:cleanup_run_changelist",
        "admin:cleanup_run_change",
        "admin:cleanup_run_live",
        "admin:cleanup_resource_changelist",
        "admin:cleanup_modulehealth_changelist",
    ],
)
def test_who_is_not_signed_in_is_sent_to_the_login_page_without_a_query_of_the_app(client, run_with_lease, page):
    """As on Django's own pages: the login, then back here (a link followed while signed out,
    a live page whose session ended), not a bare 403; and still nothing read before."""
    path = reverse(page, args=[run_with_lease.pk] if page.endswith(("_change", "_live")) else [])
    with CaptureQueriesContext(connection) as captured:
        answer = client.get(path)
    assert answer.status_code == 302
    assert answer["Location"] == f"{reverse('admin:login')}?next={path}"
    assert app_queries(captured) == []
