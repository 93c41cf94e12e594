"""The admin answers malformed filters and action selections with a message, never a 500."""

import pytest
from django.contrib.messages import get_messages

from cleanup import registry
from cleanup.models import Run, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

RUNS = "/admin/cleanup/run/"
ROWS = "/admin/cleanup/resource/"


@pytest.fixture
def ledger():
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    return run


def said(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.mark.parametrize(
    "path, query",
    [
        (ROWS, "module=sand%00box"),
        (ROWS, "state=live%00"),
        (ROWS, "kind=orc&q=orc%00"),
        (ROWS, "run__id__exact=1%00"),
        (RUNS, "status=running%00"),
        (RUNS, "q=%00"),
        (RUNS, "o=1%00"),
        ("/admin/cleanup/runlog/", "kind=run.started%00"),
        ("/admin/django_q/schedule/", "q=%00"),
        (RUNS, "sta%00tus=running"),
    ],
)
def test_a_nul_in_a_filter_is_refused_with_a_message(admin_client, ledger, path, query):
    response = admin_client.get(f"{path}?{query}")
    assert response.status_code == 302 and response["Location"] == path
    assert said(response) == ["A filter or search value may not contain a NUL character; the filters were cleared."]
    assert admin_client.get(response["Location"]).status_code == 200


def test_a_filter_without_a_nul_still_filters(admin_client, ledger):
    response = admin_client.get(f"{ROWS}?state=live")
    assert response.status_code == 200 and "orc-1" in response.content.decode()


@pytest.mark.parametrize("selected", ["abc", "99999999999999999999999", "-99999999999999999999999", "1%00", "", "1.5"])
def test_an_action_on_a_selection_that_is_not_an_id_is_refused_with_a_message(admin_client, ledger, selected):
    body = f"action=clean_up&index=0&_selected_action={selected}"
    response = admin_client.generic(
        "POST", f"{RUNS}?status=aborted", body, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 302 and response["Location"] == f"{RUNS}?status=aborted"
    (message,) = said(response)
    assert message.startswith("The selection was not applied:") and "is not the id of a run" in message
    assert not ledger.log.filter(kind="cleanup.retry").exists()


def test_an_action_on_real_ids_still_runs(admin_client, ledger):
    response = admin_client.post(
        RUNS, {"action": "clean_up", "index": 0, "_selected_action": [str(ledger.pk)], "apply": "1"}
    )  # "Clean up now" is confirmed on a page of its own
    assert response.status_code == 302
    assert ledger.log.filter(kind="cleanup.retry").exists()


def test_a_bad_selection_among_good_ones_applies_nothing(admin_client, ledger):
    other = make_run(status=RunStatus.ABORTED)
    response = admin_client.post(
        RUNS, {"action": "clean_up", "index": 0, "_selected_action": [str(ledger.pk), "x", str(other.pk)]}
    )
    assert response.status_code == 302
    assert not Run.objects.get(pk=ledger.pk).log.filter(kind="cleanup.retry").exists()
