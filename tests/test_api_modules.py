"""The API's module endpoints: health, marking down and up, the log, and what waits on a down module."""

import pytest

from cleanup import outages, registry
from cleanup.models import ModuleEvent, ModuleHealth, Resource, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def module():
    registry.register_action(FakeAction())
    return "test"


def test_it_lists_every_registered_module_and_every_one_with_a_health_row(module):
    outages.mark_down(module, by="alice", reason="connection refused")
    outages.mark_down("uninstalled", by="alice", reason="gone")
    answer = api_as("view_modulehealth").get(API + "modules/").json()
    by_name = {m["module"]: m for m in answer}
    assert {"test", "sandbox", "core", "uninstalled"} <= set(by_name)
    down = by_name["test"]
    health = ModuleHealth.objects.get(module="test")
    assert (down["state"], down["last_error"], down["changed_by"], down["registered"]) == (
        "down",
        "connection refused",
        "alice",
        True,
    )
    assert down["since"] and down["next_probe_at"]
    assert down["waiting"] == health.waiting_text() and down["waiting"].startswith("waiting: test is down since")
    assert by_name["uninstalled"]["registered"] is False
    up = by_name["sandbox"]
    assert (up["state"], up["since"], up["next_probe_at"], up["waiting"]) == ("up", None, None, None)


def test_marking_down_needs_a_reason_and_answers_the_new_state_then_409(module):
    client = api_as("cleanup_run", "view_modulehealth")
    missing = client.post(API + "modules/test/down/", {}, format="json")
    assert missing.status_code == 400 and "reason" in missing.json()["errors"]
    for bad in (
        {"reason": "   "},
        {"reason": "a\x00b"},
        {"reason": 5},
        {"reason": "x" * 1001},
        {"reason": "deploy", "extra": 1},
    ):
        assert client.post(API + "modules/test/down/", bad, format="json").status_code == 400, bad
    assert not ModuleEvent.objects.exists()

    done = client.post(API + "modules/test/down/", {"reason": " shard redeploy "}, format="json")
    assert done.status_code == 200
    assert (done.json()["state"], done.json()["last_error"], done.json()["changed_by"]) == (
        "down",
        "shard redeploy",
        "console",
    )
    event = ModuleEvent.objects.get()
    assert (event.kind, event.detail["by"], event.detail["error"]) == ("module.down", "console", "shard redeploy")

    again = client.post(API + "modules/test/down/", {"reason": "again"}, format="json")
    assert again.status_code == 409 and "already down" in again.json()["detail"]
    assert ModuleEvent.objects.count() == 1


def test_marking_up_answers_the_new_state_then_409_and_refuses_a_body(module):
    outages.mark_down(module, by="engine", reason="connection refused")
    client = api_as("cleanup_run")
    assert client.post(API + "modules/test/up/", {"force": True}, format="json").status_code == 400
    done = client.post(API + "modules/test/up/", {}, format="json")
    assert done.status_code == 200 and done.json()["state"] == "up" and done.json()["waiting"] is None
    assert ModuleHealth.objects.get(module="test").changed_by == "console"
    assert client.post(API + "modules/test/up/", {}, format="json").status_code == 409


def test_an_unknown_module_answers_404_and_nothing_is_made(module):
    client = api_as("cleanup_run")
    assert client.post(API + "modules/nope/down/", {"reason": "x"}, format="json").status_code == 404
    assert client.post(API + "modules/nope/up/", {}, format="json").status_code == 404
    assert client.post(API + "modules/a%00b/down/", {"reason": "x"}, format="json").status_code == 404
    assert not ModuleHealth.objects.filter(module="nope").exists()


def test_each_endpoint_needs_its_permission(module):
    outsider = api_as("view_run", username="viewer")
    assert outsider.get(API + "modules/").status_code == 403
    assert outsider.get(API + "modules/log/").status_code == 403
    assert outsider.get(API + "modules/test/log/").status_code == 403
    assert outsider.post(API + "modules/test/down/", {"reason": "x"}, format="json").status_code == 403
    assert outsider.post(API + "modules/test/up/", {}, format="json").status_code == 403
    assert (
        api_as("view_modulehealth", username="reader")
        .post(API + "modules/test/down/", {"reason": "x"}, format="json")
        .status_code
        == 403
    )
    assert ModuleHealth.objects.filter(state="down").count() == 0
    assert api_as(staff=False, username="player").get(API + "modules/").status_code == 403


def test_the_log_lists_entries_newest_first_paginated_and_by_module(module):
    for i in range(3):
        outages.mark_down(module, by=f"p{i}", reason="deploy")
        outages.mark_up(module, by=f"p{i}")
    outages.mark_down("other", by="alice", reason="x")
    client = api_as("view_moduleevent")
    page = client.get(API + "modules/log/?page_size=4").json()
    assert len(page["results"]) == 4 and page["next"]
    assert len(client.get(page["next"]).json()["results"]) == 3
    assert page["results"][0]["module"] == "other"
    ids = [e["id"] for e in page["results"]]
    assert ids == sorted(ids, reverse=True)
    one = client.get(API + "modules/test/log/").json()
    assert len(one["results"]) == 6 and {e["module"] for e in one["results"]} == {"test"}
    assert [e["kind"] for e in one["results"]][:2] == ["module.up", "module.down"]
    assert len(client.get(API + "modules/log/?module=other").json()["results"]) == 1
    nul = client.get(API + "modules/log/?module=a%00b")
    assert (nul.status_code, nul.json()["results"]) == (200, []), "no module name holds a NUL: nothing matches"
    assert client.get(API + "modules/never-seen/log/").status_code == 404


def test_a_row_shows_waiting_only_while_its_module_is_down_and_the_summary_lists_it(module):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="pending")
    rows = make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    Resource.objects.filter(ref="orc-2").update(state="reverted")
    client = api_as("view_resource", "view_run")
    assert {r["waiting"] for r in client.get(API + "resources/").json()["results"]} == {None}

    outages.mark_down(module, by="alice", reason="connection refused")
    listed = {r["ref"]: r["waiting"] for r in client.get(API + "resources/").json()["results"]}
    assert (listed["orc-1"]["backend"], listed["orc-1"]["reason"]) == ("test", "connection refused")
    assert listed["orc-1"]["since"].endswith("Z"), "a time in the API carries its zone"
    assert listed["orc-2"] is None, "a row given back does not wait"
    assert client.get(API + f"resources/{rows[0].pk}/").json()["waiting"] == listed["orc-1"]
    assert client.get(API + f"runs/{run.pk}/resources/").json()["results"][0]["waiting"] == listed["orc-1"]

    summary = client.get(API + "summary/").json()
    assert [(m["module"], m["last_error"]) for m in summary["modules_down"]] == [("test", "connection refused")]
    assert summary["modules_down"][0]["waiting"].startswith("waiting: test is down since")


def test_the_ledger_reads_the_down_modules_once_per_page(module, django_assert_max_num_queries):
    run = make_run(status=RunStatus.ABORTED, cleanup_status="pending")
    make_rows(make_step(run), [f"orc-{i}" for i in range(30)], placeholder=False)
    outages.mark_down(module, by="alice", reason="deploy")
    client = api_as("view_resource")
    # The shared counters (throttle, token failures) are queries of their own on the
    # database cache: 4 of the 12; the page itself does not grow with its 30 rows.
    with django_assert_max_num_queries(12) as queries:
        answer = client.get(API + "resources/").json()
    assert all(r["waiting"] for r in answer["results"])
    health = [q["sql"] for q in queries.captured_queries if 'FROM "cleanup_modulehealth"' in q["sql"]]
    assert len(health) == 1, health
