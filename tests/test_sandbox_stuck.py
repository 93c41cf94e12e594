"""A creature that refuses to leave, the shard up: the row's own failure, bounded by its attempts.

Against a real shard process with the `stuck` fault: the revert answers with the refused
creature as failed, the module stays up (the shard answered), and the row stops at
exactly ``EVENT_REVERT_MAX_ATTEMPTS`` while its run's other rows are given back.
"""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import outages
from cleanup.models import CleanupStatus, ModuleHealth, Resource
from cleanup.runner import cancel_run, start_run, tick
from cleanup.sweep import sweep
from tests import shard as shard_helpers

shard_process = shard_helpers.shard_process

pytestmark = pytest.mark.django_db


def test_a_stuck_creature_fails_its_row_up_to_the_ceiling_and_never_marks_the_module_down(shard_process):
    spawn = {"action": "sandbox.spawn", "params": {"creature": "wolf", "count": 3, "at": "pine-forest"}}
    with (
        override_settings(
            SANDBOX_SHARD_URL=shard_process.url,
            EVENT_REVERT_MAX_ATTEMPTS=3,
            EVENT_REVERT_BACKOFF_S=10,
            EVENT_OUTAGE_AFTER=2,
        ),
        time_machine.travel(timezone.now(), tick=False) as clock,
    ):
        run = start_run("wolf hunt", [spawn, {"action": "core.wait", "params": {"seconds": 3600}}])
        tick()
        wolves = list(Resource.objects.filter(run=run, kind="creature").order_by("id"))
        shard_process.post("/faults", json={"stuck": [wolves[0].ref]})
        cancel_run(run.pk)
        for _ in range(6):  # more passes than attempts: the ceiling, not the loop, must stop it
            sweep(by="test")
            clock.shift(timedelta(seconds=120))

    stuck = Resource.objects.get(pk=wolves[0].pk)
    assert (stuck.state, stuck.revert_attempts) == ("failed", 3)
    assert stuck.ref in stuck.last_error
    assert set(Resource.objects.filter(pk__in=[w.pk for w in wolves[1:]]).values_list("state", flat=True)) == {
        "reverted"
    }
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.INCOMPLETE
    assert outages.down_modules() == set()
    assert ModuleHealth.objects.filter(module="sandbox", failures_in_row__gt=0).count() == 0
    present = shard_process.post("/creatures/lookup", json={"refs": [w.ref for w in wolves]}).json()["present"]
    assert present == [stuck.ref]
