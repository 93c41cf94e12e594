"""Rule 12: a run's cleanup plan can be read without side effects."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cleanup import registry
from cleanup.models import Resource
from cleanup.plan import cleanup_plan
from tests.fakes import FakeAction, FakeLease, Scripted, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


def test_the_plan_lists_groups_verbs_rows_and_attempts_left_and_changes_nothing():
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    registry.register_lease(FakeLease())
    run = make_run()
    step = make_step(run)
    make_rows(step, ["orc-1", "orc-2"])
    make_lease_row(run)
    make_rows(make_step(run, action_id="gone.spawn"), ["x-1"], placeholder=False)
    Resource.objects.filter(ref="orc-2").update(state="failed", revert_attempts=2, last_error="503")
    before = list(Resource.objects.values())

    with CaptureQueriesContext(connection) as queries:
        plan = cleanup_plan(run)

    assert all(q["sql"].lstrip().upper().startswith("SELECT") for q in queries.captured_queries)
    assert list(Resource.objects.values()) == before
    assert [g["verb"] for g in plan] == ["test.rate.restore", "test.spawn.revert", None]
    assert plan[2]["problem"] == 'no module can give back what "gone.spawn" made'
    rows = {r["ref"]: r for r in plan[1]["rows"]}
    assert (rows["orc-2"]["attempts"], rows["orc-2"]["attempts_left"], rows["orc-2"]["last_error"]) == (2, 1, "503")
    assert rows["orc-1"]["attempts_left"] == 3
    assert step.idempotency_key in rows
