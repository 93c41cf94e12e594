"""The API of a fleet: one module, two backends (north and south), each with its own health.

Rows and steps carry their backend and filter by it; what waits says its own backend's
outage; module health lists every backend of every module; a backend is marked down, up
and reconciled on its own, through ``modules/{name}/backends/{backend}/...``.
"""

import pytest

from cleanup import outages, registry
from cleanup.models import ModuleEvent, ModuleHealth, Resource, RunStatus, Step
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def module():
    registry.register_action(FakeAction())
    return "test"


def on(backend, step, refs):
    """A step of ``backend`` and its rows (no placeholder)."""
    Step.objects.filter(pk=step.pk).update(backend=backend)
    rows = make_rows(step, refs, placeholder=False)
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(backend=backend)
    return rows


@pytest.fixture
def fleet(module):
    ended = make_run(status=RunStatus.ABORTED, name="orc raid", cleanup_status="pending")
    on("north", make_step(ended), ["orc-n1", "orc-n2"])
    on("south", make_step(ended), ["orc-s1"])
    return ended


def test_a_row_waits_only_on_its_own_backend(fleet):
    outages.mark_down("test", backend="north", by="alice", reason="connection refused")
    client = api_as("view_resource")
    listed = {r["ref"]: r["waiting"] for r in client.get(API + "resources/").json()["results"]}
    since = ModuleHealth.objects.get(module="test", backend="north").down_since
    assert listed["orc-n1"] == {
        "backend": "test/north",
        "since": since.isoformat().replace("+00:00", "Z"),
        "reason": "connection refused",
    }
    assert listed["orc-s1"] is None, "south answers: its row does not wait"
    north = Resource.objects.get(ref="orc-n2")
    row = client.get(API + f"resources/{north.pk}/").json()
    assert row["waiting"] == listed["orc-n1"]
    assert "waiting" not in row["last_error"], "waiting is its own field, not text in last_error"
    assert outages.down_backends() == {("test", "north")}


# -- rows, steps and the modules' log carry their backend and filter by it ------------------


def refs(answer):
    return {r["ref"] for r in answer["results"]}


def test_rows_and_steps_carry_their_backend_and_the_ledger_filters_by_it(fleet):
    client = api_as("view_resource", "view_run")
    rows = client.get(API + "resources/").json()["results"]
    assert {r["ref"]: r["backend"] for r in rows} == {"orc-n1": "north", "orc-n2": "north", "orc-s1": "south"}
    assert refs(client.get(API + "resources/?backend=north").json()) == {"orc-n1", "orc-n2"}
    assert refs(client.get(API + "resources/?backend=south&module=test&state=live").json()) == {"orc-s1"}
    assert refs(client.get(API + "resources/?backend=").json()) == set(), "'' is a module's only backend"
    assert refs(client.get(API + f"runs/{fleet.pk}/resources/?backend=south").json()) == {"orc-s1"}
    steps = client.get(API + f"runs/{fleet.pk}/").json()["steps"]
    assert sorted(s["backend"] for s in steps) == ["north", "south"]


@pytest.mark.parametrize("bad", ["a/b", " north", "north ", "a\x00b", "x" * 101])
def test_a_backend_filter_no_backend_can_have_matches_nothing(fleet, bad):
    outages.mark_down("test", backend="north", by="alice", reason="deploy")
    client = api_as("view_resource", "view_moduleevent")
    for url in ("resources/", f"runs/{fleet.pk}/resources/", "modules/log/", "modules/test/log/"):
        answer = client.get(API + url, {"backend": bad})
        assert (answer.status_code, answer.json()["results"]) == (200, []), url


def test_the_modules_log_carries_and_filters_the_backend(module):
    outages.mark_down("test", backend="north", by="alice", reason="deploy")
    outages.mark_down("test", backend="south", by="bob", reason="crash")
    outages.mark_down("test", by="carol", reason="all of it")
    client = api_as("view_moduleevent")
    entries = client.get(API + "modules/log/").json()["results"]
    assert [e["backend"] for e in entries] == ["", "south", "north"]
    north = client.get(API + "modules/log/?backend=north").json()["results"]
    assert [(e["backend"], e["detail"]["by"]) for e in north] == [("north", "alice")]
    assert [e["detail"]["by"] for e in client.get(API + "modules/log/?backend=&module=test").json()["results"]] == [
        "carol"
    ]
    assert [e["detail"]["by"] for e in client.get(API + "modules/test/log/?backend=south").json()["results"]] == ["bob"]


# -- module health: every backend; each marked down, up and reconciled on its own ----------


def test_modules_lists_each_module_with_every_backend_and_keeps_the_fields_of_its_own(fleet):
    outages.mark_down("test", backend="north", by="alice", reason="connection refused")
    outages.note_boot("test", "south", "boot-4f1c")
    answer = {m["module"]: m for m in api_as("view_modulehealth").get(API + "modules/").json()}
    test = answer["test"]
    assert (test["state"], test["since"], test["waiting"], test["registered"]) == ("up", None, None, True)
    backends = {b["backend"]: b for b in test["backends"]}
    # The module never named a backend "": it gets no row for one.
    assert list(backends) == ["north", "south"]
    north = backends["north"]
    health = ModuleHealth.objects.get(module="test", backend="north")
    assert (north["module"], north["name"], north["state"], north["last_error"]) == (
        "test",
        "test/north",
        "down",
        "connection refused",
    )
    assert north["since"] and north["next_probe_at"] and north["waiting"] == health.waiting_text()
    assert (backends["south"]["state"], backends["south"]["boot_id"], backends["south"]["waiting"]) == (
        "up",
        "boot-4f1c",
        None,
    )
    assert [b["backend"] for b in answer["sandbox"]["backends"]] == [""]


def test_a_backend_is_marked_down_and_up_alone_and_only_its_rows_wait(fleet):
    client = api_as("cleanup_run", "view_resource")
    done = client.post(API + "modules/test/backends/north/down/", {"reason": " shard redeploy "}, format="json")
    assert done.status_code == 200, done.content
    assert (done.json()["backend"], done.json()["state"], done.json()["last_error"], done.json()["changed_by"]) == (
        "north",
        "down",
        "shard redeploy",
        "console",
    )
    assert outages.down_backends() == {("test", "north")}
    event = ModuleEvent.objects.get()
    assert (event.backend, event.kind, event.detail["by"]) == ("north", "module.down", "console")
    waiting = {r["ref"]: r["waiting"] for r in client.get(API + "resources/").json()["results"]}
    assert waiting["orc-n1"] and waiting["orc-n2"] and waiting["orc-s1"] is None

    again = client.post(API + "modules/test/backends/north/down/", {"reason": "again"}, format="json")
    assert again.status_code == 409 and "test/north is already down" in again.json()["detail"]

    up = client.post(API + "modules/test/backends/north/up/", {}, format="json")
    assert up.status_code == 200 and (up.json()["state"], up.json()["waiting"]) == ("up", None)
    assert outages.down_backends() == set()
    assert client.post(API + "modules/test/backends/north/up/", {}, format="json").status_code == 409
    assert client.post(API + "modules/test/backends/never-seen/up/", {}, format="json").status_code == 409
    assert ModuleEvent.objects.count() == 2


def test_a_backend_never_seen_is_marked_down_through_the_engine(module):
    assert not ModuleHealth.objects.filter(backend="east").exists()
    done = api_as("cleanup_run").post(API + "modules/test/backends/east/down/", {"reason": "flooded"}, format="json")
    assert done.status_code == 200 and done.json()["name"] == "test/east"
    health = ModuleHealth.objects.get(module="test", backend="east")
    assert (health.state, health.last_error, health.changed_by) == ("down", "flooded", "console")
    assert outages.down_backends() == {("test", "east")}


def test_the_modules_own_endpoints_still_mark_its_backend_of_its_own(fleet):
    client = api_as("cleanup_run")
    done = client.post(API + "modules/test/down/", {"reason": "all of it"}, format="json")
    assert done.status_code == 200 and done.json()["state"] == "down"
    assert [b["backend"] for b in done.json()["backends"]] == ["", "north", "south"]
    assert outages.down_backends() == {("test", "")}
    assert client.post(API + "modules/test/up/", {}, format="json").json()["state"] == "up"


def test_reconciling_a_backend_queues_its_reconcile_alone(fleet, monkeypatch):
    queued = []
    monkeypatch.setattr("cleanup.api.views.queue_reconcile", lambda **kw: queued.append(kw))
    client = api_as("cleanup_run")
    answer = client.post(API + "modules/test/backends/north/reconcile/", {"restarted": True}, format="json")
    assert answer.status_code == 202
    assert answer.json() == {"module": "test", "backend": "north", "restarted": True, "queued": True, "after": 0}
    assert queued == [{"module": "test", "restarted": True, "backend": "north"}]
    whole = client.post(API + "modules/test/reconcile/", {}, format="json")
    assert whole.json() == {"module": "test", "restarted": False, "queued": True, "after": 0}
    assert queued[-1] == {"module": "test", "restarted": False, "backend": None}


def test_a_reconcile_of_one_backend_settles_only_its_rows(django_capture_on_commit_callbacks):
    reconcile = Scripted({"ok": True, "in_force": []})
    registry.register_action(FakeAction(reconcile=reconcile))
    run = make_run(status=RunStatus.RUNNING)
    on("north", make_step(run), ["orc-n1"])
    on("south", make_step(run), ["orc-s1"])
    with django_capture_on_commit_callbacks(execute=True):
        answer = api_as("cleanup_run").post(API + "modules/test/backends/north/reconcile/", {}, format="json")
    assert answer.status_code == 202
    assert dict(Resource.objects.values_list("ref", "state")) == {"orc-n1": "orphaned", "orc-s1": "live"}
    assert {call.get("backend") for call in reconcile.calls} == {"north"}


@pytest.mark.parametrize("verb, body", [("down", {"reason": "x"}), ("up", {}), ("reconcile", {})])
def test_each_backend_endpoint_answers_404_400_and_403_as_the_modules_do(module, verb, body):
    client = api_as("cleanup_run")
    assert client.post(API + f"modules/nope/backends/north/{verb}/", body, format="json").status_code == 404
    for bad in ("%20north", "north%20", "x" * 101):
        answer = client.post(API + f"modules/test/backends/{bad}/{verb}/", body, format="json")
        assert answer.status_code == 400, bad
        assert "not a backend's name" in answer.json()["errors"]["backend"][0]
    # A control character in a path is no URL of the site (cleanup.security): 404.
    for missing in ("a%2Fb", "a%00b"):
        assert client.post(API + f"modules/test/backends/{missing}/{verb}/", body, format="json").status_code == 404
    assert client.post(API + f"modules/test/backends/north/{verb}/", {"extra": 1}, format="json").status_code == 400
    reader = api_as("view_modulehealth", "view_resource", username="reader")
    assert reader.post(API + f"modules/test/backends/north/{verb}/", body, format="json").status_code == 403
    assert not ModuleHealth.objects.exclude(backend="").exists() and not ModuleEvent.objects.exists()


def test_the_summary_names_each_backend_down(fleet):
    outages.mark_down("test", backend="north", by="alice", reason="deploy")
    down = api_as("view_run", "view_resource").get(API + "summary/").json()["modules_down"]
    assert [(d["module"], d["backend"], d["name"], d["last_error"]) for d in down] == [
        ("test", "north", "test/north", "deploy")
    ]
