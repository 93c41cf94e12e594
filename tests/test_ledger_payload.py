"""An action row's payload is the module's, as it answered; the engine keeps what it needs
(the action that made the row) in a column of its own. A lease row's payload holds the
engine's baseline, which no module receives (rule 15)."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from cleanup import ledger, registry
from cleanup.models import Resource
from cleanup.reconcile import reconcile_module
from cleanup.sweep import sweep
from tests.fakes import FakeAction, FakeLease, Scripted, make_run, make_step, states
from tests.test_api_access import API, api_as

MODULE_PAYLOAD = {"action": "jump", "idempotency_key": "the module's own", "at": "gate"}


def record(step, payload=MODULE_PAYLOAD):
    return ledger.record_resources(step, "test", [{"kind": "orc", "ref": "orc-1", "payload": payload}])


@pytest.mark.django_db
def test_it_stores_a_modules_payload_as_it_answered():
    step = make_step(make_run())
    placeholder = ledger.write_placeholder(step, "test")
    record(step)

    row = Resource.objects.get(ref="orc-1")
    assert row.payload == MODULE_PAYLOAD
    assert (row.action, placeholder.action, placeholder.payload) == ("test.spawn", "test.spawn", {})


@pytest.mark.django_db
def test_a_row_that_outlived_its_step_reverts_through_the_action_that_made_it():
    revert = Scripted({"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    step = make_step(run)
    record(step)
    step.delete()

    sweep()

    assert states(run) == {"orc-1": "reverted"}, Resource.objects.get(ref="orc-1").last_error
    assert revert.calls[0]["resources"] == [
        {"kind": "orc", "ref": "orc-1", "payload": MODULE_PAYLOAD, "member_key": ""}
    ]


@pytest.mark.django_db
def test_a_lease_row_keeps_its_action_beside_the_baseline():
    lease = registry.register_lease(FakeLease())
    step = make_step(make_run(), action_id="core.lease")
    row = ledger.reserve_lease(step, lease, "camp", baseline=1, applied=5)
    assert row.action == "core.lease"
    assert row.payload == {"baseline": 1, "applied": 5, "confirmed": False}


@pytest.mark.django_db
def test_a_lease_restore_receives_the_baseline_and_never_the_rows_payload():
    lease = registry.register_lease(FakeLease(values={"camp": 5}))
    run = make_run()
    row = ledger.reserve_lease(make_step(run, action_id="core.lease"), lease, "camp", baseline=1, applied=5)
    ledger.confirm_lease(row)

    sweep()

    # FakeLease.restore takes exactly the contract's keywords: a payload passed along would fail it.
    assert lease.restores == [{"baseline": 1, "expected": 5, "run_id": run.pk, "target": "camp"}]
    assert (states(run), lease.values) == ({"test.rate#camp": "reverted"}, {"camp": 1})


@pytest.mark.django_db
def test_a_resurrected_row_carries_the_action_and_the_modules_payload():
    registry.register_action(
        FakeAction(reconcile=Scripted({"ok": True, "in_force": ["orc-1"]}), revert=Scripted({"ok": True, "failed": []}))
    )
    run = make_run()
    step = make_step(run)
    old = record(step)[0]
    Resource.objects.filter(pk=old.pk).update(state="reverted", resolved_at=timezone.now())
    step.delete()

    assert reconcile_module("test", restarted=True).resurrected == 1

    again = Resource.objects.get(resurrected_from=old)
    assert (again.state, again.action, again.payload) == ("live", "test.spawn", MODULE_PAYLOAD)


@pytest.mark.django_db
def test_the_api_shows_the_action_apart_from_the_payload():
    step = make_step(make_run())
    record(step)
    body = api_as("view_resource").get(f"{API}resources/").json()["results"][0]
    assert (body["action"], body["payload"]) == ("test.spawn", MODULE_PAYLOAD)


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_the_engines_action_out_of_existing_payloads():
    executor = MigrationExecutor(connection)
    executor.migrate([("cleanup", "0002_attempt")])
    old = executor.loader.project_state([("cleanup", "0002_attempt")]).apps
    Run, Step, Row = (old.get_model("cleanup", name) for name in ("Run", "Step", "Resource"))
    run = Run.objects.create(name="before", status="completed")
    step = Step.objects.create(run=run, position=0, action_id="test.spawn", idempotency_key="k1")
    rows = {
        "placeholder": dict(
            kind="step", ref="k1", step=step, payload={"action": "test.spawn", "idempotency_key": "k1"}
        ),
        "engine": dict(kind="orc", ref="orc-1", step=step, payload={"action": "test.spawn", "at": "gate"}),
        "module": dict(kind="orc", ref="orc-2", step=step, payload={"action": "jump"}),
        "loose": dict(kind="orc", ref="orc-3", step=None, payload={"action": "test.spawn"}),
        "lease": dict(
            kind="override",
            ref="test.rate#camp",
            step=step,
            payload={"baseline": 1, "applied": 5, "action": "core.lease"},
        ),
    }
    for fields in rows.values():
        Row.objects.create(run=run, module="test", **fields)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("cleanup"))

    moved = {r.ref: (r.action, r.payload) for r in Resource.objects.all()}
    assert moved == {
        "k1": ("test.spawn", {}),
        "orc-1": ("test.spawn", {"at": "gate"}),
        "orc-2": ("test.spawn", {"action": "jump"}),  # the module's own field, left to it
        "orc-3": ("test.spawn", {}),
        "test.rate#camp": ("test.spawn", {"baseline": 1, "applied": 5}),
    }
