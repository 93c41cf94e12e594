"""Rule 9 with two sweepers at once: a run another sweeper is claiming is passed over, not waited for."""

import threading

import pytest
from django.db import connections, transaction

from cleanup import registry
from cleanup.models import Run
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


def test_a_sweeper_passes_over_a_run_another_is_claiming():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    busy, free = make_run(name="being claimed"), make_run(name="free")
    make_rows(make_step(busy), ["orc-1"])
    make_rows(make_step(free), ["wolf-1"])
    locked, done = threading.Event(), threading.Event()

    def other_sweeper():
        # Another sweeper's claim transaction, holding the run's lock.
        with transaction.atomic():
            Run.objects.select_for_update().get(pk=busy.pk)
            locked.set()
            done.wait(30)
        connections.close_all()

    holder = threading.Thread(target=other_sweeper)
    holder.start()
    try:
        assert locked.wait(10)
        result = sweep()
    finally:
        done.set()
        holder.join(30)

    assert result.runs == 1
    assert set(states(free).values()) == {"reverted"}
    assert set(states(busy).values()) == {"live"}, "the locked run was worked (or waited for)"
