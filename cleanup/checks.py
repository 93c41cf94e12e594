"""System checks (`manage.py check`) for the database, the engine's settings and django-q2's
configuration. Imports only `cleanup.conf`, whose table the setting checks iterate,
`cleanup.limits` (where the shared counters are kept), `cleanup.skew` (the clocks'
offsets from the database's), and Django.
May import: conf, limits, skew.
"""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, transaction
from django.db.backends.postgresql.base import DatabaseWrapper as PostgreSQLWrapper
from django.db.utils import load_backend

from . import limits, skew
from .conf import SETTINGS, setting


@checks.register(checks.Tags.compatibility)
def check_database_is_postgresql(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The engine's claims, verdicts and tally are PostgreSQL's (SKIP LOCKED, triggers, advisory
    locks): every database of the site must be one."""
    errors: list[checks.CheckMessage] = []
    for alias, database in settings.DATABASES.items():
        engine = database.get("ENGINE") or ""
        if not _is_postgresql(engine):
            errors.append(
                checks.Error(
                    f"The database {alias!r} is {_name(engine)} ({engine or 'no ENGINE'}); "
                    "the app runs on PostgreSQL only.",
                    hint="Point it at a PostgreSQL server, 15 or later: set DATABASE_URL, such as "
                    "postgres://user:password@host:5432/events, where the site's settings read it, "
                    "else DATABASES itself.",
                    id="cleanup.E020",
                )
            )
    return errors


@checks.register(checks.Tags.database, deploy=True)
def check_connections_are_pooled(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Served under ASGI (the production recipe), a request's queries run on a thread that
    lives only as long as the request: without a pool, each would open a connection of its
    own and leave it to be closed when its thread is gone."""
    database = settings.DATABASES.get("default", {})
    if (database.get("OPTIONS") or {}).get("pool"):
        return []
    return [
        checks.Warning(
            "The database's connections are not pooled: under ASGI each request would open its own.",
            hint="Set DATABASE_POOL_MAX_SIZE (such as 4) where the site's settings read it, else "
            "DATABASES['default']['OPTIONS']['pool'] (README, Running in production).",
            id="cleanup.W030",
        )
    ]


@checks.register(checks.Tags.caches, deploy=True)
def check_counters_are_shared(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The throttles, the token lockout and the error mail's bound count in one cache: in a
    process's own memory, three workers would allow three times each limit."""
    backend = limits.per_process()
    if backend is None:
        return []
    return [
        checks.Warning(
            f"The counters' cache {limits.alias()!r} ({backend or 'no BACKEND'}) is not shared by the "
            "site's processes: each worker would count the API's throttles, failed tokens and error "
            "mail apart.",
            hint="Set REDIS_URL, or leave it unset for the database cache the site's settings name "
            f"(the table {limits.TABLE!r}, made by migrate); else point CACHES[{limits.COUNTERS_CACHE!r}] "
            "at Redis or django.core.cache.backends.db.DatabaseCache.",
            id="cleanup.W031",
        )
    ]


@checks.register(checks.Tags.database)
def check_clocks_agree_with_the_database(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """This process's clock, and each cluster's recent reading (`cleanup.skew`), against the
    database's. Like Django's own database checks, it queries only when asked to
    (``check --database default``, ``migrate``), and says nothing when the database does not answer."""
    if not databases or "default" not in databases:
        return []
    try:
        here = skew.measure()
    except DatabaseError:
        return []
    found = [("This process's clock", here.offset_s)] if here.off else []
    try:
        with transaction.atomic():  # a savepoint: a table not yet made (before migrate) breaks nothing
            found += [
                (f"The clock of the cluster {r.who!r} (its latest reading)", r.offset_s)
                for r in skew.readings()
                if abs(r.offset_s) > skew.WARN_S
            ]
    except DatabaseError:
        pass
    return [
        checks.Warning(
            f"{whose} is {offset:+.1f} s off the database's (more than {skew.WARN_S:g} s). Claims and "
            "every time that decides who may act use the database's clock, so only the times in "
            "its log lines are off.",
            hint="Keep every machine's clock in time with NTP (timedatectl set-ntp true, chrony or "
            "systemd-timesyncd), the database server's too; see docs/operations.md, Worker clocks.",
            id="cleanup.W032",
        )
        for whose, offset in found
    ]


def _is_postgresql(engine: str) -> bool:
    """Is the engine Django's PostgreSQL backend, or one built on it (PostGIS)?"""
    try:
        wrapper = load_backend(engine).DatabaseWrapper
    except (ImproperlyConfigured, ImportError):
        return False
    return issubclass(wrapper, PostgreSQLWrapper)


def _name(engine: str) -> str:
    """What a person calls the engine's database (``SQLite``); its last dotted name when its
    backend cannot be loaded here."""
    try:
        name: str = load_backend(engine).DatabaseWrapper.display_name
        return name
    except (ImproperlyConfigured, ImportError):
        return engine.rsplit(".", 1)[-1] or "unset"


@checks.register(checks.Tags.compatibility)
def check_engine_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for entry in SETTINGS:
        if entry.low is None or entry.high is None:
            continue
        # An old name is checked like the new one: it is still read.
        for name in entry.names:
            if hasattr(settings, name):
                error = _bounds_error(name, getattr(settings, name), entry.low, entry.high)
                errors += [error] if error else []
    if not errors:
        budget_s = setting("EVENT_DEFAULT_BUDGET_MS")
        claim_s = setting("EVENT_CLAIM_TIMEOUT_S")
        if claim_s * 1000 <= budget_s:
            errors.append(
                checks.Error(
                    f"EVENT_CLAIM_TIMEOUT_S={claim_s!r} is not longer than EVENT_DEFAULT_BUDGET_MS={budget_s!r} ms.",
                    hint="A claim must outlive the module call it covers, or a second "
                    "sweeper takes the row while the first is still waiting for its answer.",
                    id="cleanup.E003",
                )
            )
    return errors


def _bounds_error(name: str, value: object, low: int, high: int) -> checks.CheckMessage | None:
    """Why a whole-number setting's value is refused (E001, E002), or None."""
    hint = f"Set {name} to a whole number from {low} to {high}."
    if isinstance(value, bool) or not isinstance(value, int):
        return checks.Error(f"{name}={value!r} is not a whole number.", hint=hint, id="cleanup.E001")
    if not low <= value <= high:
        return checks.Error(f"{name}={value!r} is outside {low}..{high}.", hint=hint, id="cleanup.E002")
    return None


@checks.register(checks.Tags.compatibility)
def check_renamed_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [
        checks.Warning(
            f"{old} is deprecated: it is now {entry.name}.",
            hint=f"Rename {old} to {entry.name}, in the environment or the settings; {old} is read only "
            f"while {entry.name} is not set.",
            id="cleanup.W001",
        )
        for entry in SETTINGS
        for old in entry.old_names
        if hasattr(settings, old)
    ]


@checks.register(checks.Tags.compatibility)
def check_q_cluster(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    conf = getattr(settings, "Q_CLUSTER", None)
    if not isinstance(conf, dict):
        return [checks.Error("Q_CLUSTER is not set.", id="cleanup.E010")]
    errors: list[checks.CheckMessage] = []
    timeout, retry = conf.get("timeout"), conf.get("retry", 60)
    if not isinstance(timeout, int) or not isinstance(retry, int) or timeout >= retry:
        errors.append(
            checks.Error(
                f"Q_CLUSTER timeout={timeout!r} must be a whole number below retry={retry!r}.",
                hint="django-q2 hands a task out again after `retry` seconds; a task that "
                "may still be running then is run twice.",
                id="cleanup.E011",
            )
        )
    tick_s = setting("EVENT_TICK_BUDGET_S")
    call_s = setting("EVENT_DEFAULT_BUDGET_MS") / 1000
    if isinstance(timeout, int) and isinstance(tick_s, int) and tick_s + call_s >= timeout:
        errors.append(
            checks.Error(
                f"EVENT_TICK_BUDGET_S={tick_s!r} plus one module call ({call_s:g} s) "
                f"is not below Q_CLUSTER timeout={timeout!r}.",
                hint="A tick stops starting work after its budget, but the call it is in may "
                "still take its own budget; both must end before django-q2 kills the task.",
                id="cleanup.E014",
            )
        )
    if not conf.get("ack_failures"):
        errors.append(
            checks.Error(
                "Q_CLUSTER ack_failures is off: a failing task is handed out again for ever.",
                id="cleanup.E012",
            )
        )
    attempts = conf.get("max_attempts", 0)
    if not isinstance(attempts, int) or attempts < 1:
        errors.append(
            checks.Error(
                f"Q_CLUSTER max_attempts={attempts!r} must be at least 1 (0 means for ever).",
                id="cleanup.E013",
            )
        )
    return errors
