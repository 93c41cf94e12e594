"""The API of a fleet: one module, two backends (north and south), each with its own health.

Rows and steps carry their backend and filter by it; what waits says its own backend's
outage; module health lists every backend of every module; a backend is marked down, up
and reconciled on its own, through ``modules/{name}/backends/{backend}/...``.
"""

import pytest

from cleanup import outages, registry
from cleanup.models import Resource, RunStatus, Step
from tests.fakes import FakeAction, make_rows, make_run, make_step
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
    assert listed["orc-n1"].startswith("waiting: test/north is down since")
    assert "(connection refused)" in listed["orc-n1"]
    assert listed["orc-s1"] is None, "south answers: its row does not wait"
    north = Resource.objects.get(ref="orc-n2")
    assert client.get(API + f"resources/{north.pk}/").json()["waiting"].startswith("waiting: test/north")
    assert outages.down_backends() == {("test", "north")}
