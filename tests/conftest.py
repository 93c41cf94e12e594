import pytest
from django.conf import settings

from cleanup import registry
from tests.fakes import FakeAction, Scripted, despawner, spawner

# A test that starts a sandbox shard process, through `tests.shard.shard_process` or a
# fixture built on it, is marked `slow` here, so `-m 'not slow'` leaves it out. The other
# slow tests carry the mark themselves.
PROCESS_FIXTURES = frozenset({"shard_process"})


@pytest.hookimpl(tryfirst=True)  # before `-m` picks the tests by their marks
def pytest_collection_modifyitems(items):
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_report_header(config):
    db = settings.DATABASES["default"]
    return f"database: PostgreSQL at {db.get('HOST') or 'local'}:{db.get('PORT') or ''} ({db['TEST']['NAME']})"


@pytest.fixture(autouse=True)
def fresh_counters():
    """What one test counted for the metrics is not written by the next (`cleanup.counters`)."""
    from cleanup import counters

    counters.forget()
    yield
    counters.forget()


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test starts with an empty cache: no failed token authentications or error mails
    counted by an earlier test."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(autouse=True)
def fresh_watch():
    """Each test's first tick watches the backends, as a process's first tick does."""
    from cleanup import runner

    runner._last_watch["at"] = None
    yield


@pytest.fixture(autouse=True)
def isolated_registry():
    """Each test registers its own modules; the site's registrations come back after it."""
    actions, leases = dict(registry._actions), dict(registry._leases)
    yield
    registry._actions.clear()
    registry._actions.update(actions)
    registry._leases.clear()
    registry._leases.update(leases)


@pytest.fixture
def world():
    """`test.spawn` over an in-memory world: ref -> the key that made it."""
    world = {}
    registry.register_action(FakeAction(perform=Scripted(spawner(world)), revert=Scripted(despawner(world))))
    return world
