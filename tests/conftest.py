import pytest
from django.conf import settings

from cleanup import registry
from tests.fakes import FakeAction, Scripted, despawner, spawner


def pytest_report_header(config):
    db = settings.DATABASES["default"]
    engine = db["ENGINE"].rsplit(".", 1)[-1]
    where = f"{db.get('HOST') or 'local'}:{db.get('PORT') or ''}" if engine != "sqlite3" else db["NAME"]
    return f"database: {engine} ({where})"


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
