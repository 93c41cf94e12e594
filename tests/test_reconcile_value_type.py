"""A lease's value_type and a restart's failed rows (rule 14): the engine compares values as
the lease reads them, and asks about failed rows after a restart like live ones."""

import pytest

from cleanup import registry
from cleanup.models import Resource, ResourceState
from cleanup.reconcile import reconcile_module
from cleanup.sweep import sweep
from tests.fakes import FakeAction, FakeLease, Scripted, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


class TextLease(FakeLease):
    """A backend that keeps every value as text, as a game server's cvars are."""

    value_type = int

    def read(self, *, target):
        value = self.values.get(target)
        return {"ok": True, "value": None if value is None else str(value)}


def test_an_int_lease_read_back_as_text_is_found_in_force_after_a_restart():
    lease = registry.register_lease(TextLease(values={"camp": 800}))
    run = make_run()
    make_lease_row(run, target="camp", baseline=800, applied=300)
    sweep()
    assert lease.values["camp"] == 800
    lease.values["camp"] = 300  # the rollback: the backend shows "300" again
    summary = reconcile_module("test", restarted=True)
    assert summary.resurrected == 1
    again = Resource.objects.get(state=ResourceState.LIVE, resurrected_from__isnull=False)
    assert again.ref == "test.rate#camp"


def test_without_a_value_type_the_same_text_is_not_recognised():
    """The comparison the value_type fixes: "300" is not 300 to the engine by itself."""
    lease = registry.register_lease(TextLease(values={"camp": 800}))
    lease.value_type = None
    make_lease_row(make_run(), target="camp", baseline=800, applied=300)
    sweep()
    lease.values["camp"] = 300
    assert reconcile_module("test", restarted=True).resurrected == 0


def test_an_int_lease_whose_baseline_reads_back_as_text_is_settled_as_forgotten():
    lease = registry.register_lease(TextLease(values={"camp": 800}))
    held = make_lease_row(make_run(status="running"), target="camp", baseline=800, applied=300)
    lease.values["camp"] = 800  # the restart lost the override: "800" is read back
    assert reconcile_module("test", restarted=True).forgotten == 1
    held.refresh_from_db()
    assert held.state == ResourceState.ORPHANED


def test_an_int_lease_still_applied_as_text_is_left_live():
    lease = registry.register_lease(TextLease(values={"camp": 300}))
    held = make_lease_row(make_run(status="running"), target="camp", baseline=800, applied=300)
    assert reconcile_module("test", restarted=True).forgotten == 0
    held.refresh_from_db()
    assert held.state == ResourceState.LIVE
    del lease


def test_after_a_restart_failed_rows_gone_are_orphaned_and_those_still_there_stay_failed():
    world = {"bot-2"}
    registry.register_action(
        FakeAction(
            revert=Scripted({"ok": True, "failed": []}),
            reconcile=lambda **kw: {"ok": True, "in_force": [r["ref"] for r in kw["resources"] if r["ref"] in world]},
        )
    )
    step = make_step(make_run())
    _placeholder, gone, there = make_rows(step, ["bot-1", "bot-2"])
    Resource.objects.filter(pk__in=[gone.pk, there.pk]).update(
        state=ResourceState.FAILED, retryable=False, last_error="refused"
    )
    assert reconcile_module("test").orphaned == 0, "without a restart failed rows are not asked about"
    summary = reconcile_module("test", restarted=True)
    assert summary.orphaned == 1
    gone.refresh_from_db()
    there.refresh_from_db()
    assert gone.state == ResourceState.ORPHANED
    assert gone.last_error == "the backend restarted and this is no longer in the world"
    assert there.state == ResourceState.FAILED


def test_value_type_must_be_callable():
    lease = FakeLease(id="test.typed")
    lease.value_type = "int"
    with pytest.raises(registry.RegistryError, match="value_type must be int, float, str or a callable"):
        registry.register_lease(lease)


def test_short_key_is_short_stable_and_of_its_alphabet():
    first = registry.short_key("0f3a9c2e5b7d41a6b8c9d0e1f2a3b4c5", 8)
    assert first == registry.short_key("0f3a9c2e5b7d41a6b8c9d0e1f2a3b4c5", 8)
    assert len(first) == 8 and set(first) <= set(registry.SHORT_KEY_ALPHABET)
    assert first != registry.short_key("0f3a9c2e5b7d41a6b8c9d0e1f2a3b4c6", 8)
    assert len(registry.short_key("k")) == 12
    with pytest.raises(ValueError, match="length must be a whole number from 4 to 52"):
        registry.short_key("k", 3)


def test_a_value_type_that_cannot_parse_a_value_compares_it_as_it_is():
    lease = FakeLease(id="test.typed")
    lease.value_type = int
    assert registry.same_value(lease, "300", 300)
    assert registry.same_value(lease, "high", "high")  # int("high") fails: compared as text
    assert not registry.same_value(lease, "high", 300)
    lease.value_type = lambda value: value.strip()  # fails on numbers
    assert registry.same_value(lease, 5, 5)
