import pytest
from django.conf import settings

from cleanup import registry
from tests.clock import clocks_apart  # noqa: F401  (a fixture; the database's clock follows time travel)
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
def fresh_cache(request):
    """Each test that may use the database starts with empty counters (`cleanup.limits`): no
    failed token authentications, throttle counts or error mails of an earlier test. They
    are the database's cache (Redis's with REDIS_URL), so a test without the database
    cannot have counted any."""
    from django.core.cache import caches

    from cleanup import limits
    from cleanup.api import tokens

    tokens.forget()
    marker = request.node.get_closest_marker("django_db")
    # A test marked with no database (``databases=[]``) may not query it, not even to clear it.
    marked = marker is not None and marker.kwargs.get("databases") != []
    uses_db = marked or {"db", "transactional_db", "django_db_reset_sequences"} & set(request.fixturenames)
    if uses_db:
        request.getfixturevalue("transactional_db" if "transactional_db" in request.fixturenames else "db")
        for alias in {"default", limits.alias()}:
            caches[alias].clear()
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


@pytest.fixture(scope="session", autouse=True)
def no_session_left_on_the_test_database(django_db_setup, django_db_blocker):
    """The test database can be dropped at the end: a session some test left open on it (the
    change feed's listener of a live server's thread, a process a test started) is ended
    first, so the drop does not fail and leave the database behind on the server."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
