"""What the story tests against real backends share (`test_arena_night`, `test_luanti_story`,
`test_deadman_switch`, `test_luanti_deadman`): quick settings, a step that holds a run open,
the refs a run took, and waiting for the engine or a backend to get somewhere."""

import time

from cleanup.models import CleanupStatus, Resource
from cleanup.sweep import sweep

# No backoff, and an outage seen at the first answer that blames the backend, probed each second.
QUICK = {
    "EVENT_REVERT_BACKOFF_S": 0,
    "EVENT_STEP_BACKOFF_S": 0,
    "EVENT_OUTAGE_AFTER": 1,
    "EVENT_OUTAGE_PROBE_S": 1,
    "EVENT_OUTAGE_SPREAD_S": 0,
}


def hold(seconds=3600):
    """A step that keeps its run going (an hour unless told)."""
    return {"action": "core.wait", "params": {"seconds": seconds}}


def refs(run, kind="creature", state=None):
    """The refs of the run's rows of ``kind`` (in ``state`` when given), sorted."""
    rows = Resource.objects.filter(run=run, kind=kind)
    if state:
        rows = rows.filter(state=state)
    return sorted(rows.values_list("ref", flat=True))


def finished(run):
    """A check: has the run's cleanup completed?"""

    def check():
        run.refresh_from_db()
        return run.cleanup_status == CleanupStatus.COMPLETE

    return check


def sweep_until(done, timeout=30.0):
    """Sweep until ``done()`` (the engine's own passes, half a second apart at most)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the rows were not given back in time"
        sweep()
        if not done():
            time.sleep(0.5)


def wait_until(check, timeout_s, every=0.05):
    """Wait, without the engine, until ``check()`` holds or ``timeout_s`` pass; answers whether it held."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(every)
    return check()
