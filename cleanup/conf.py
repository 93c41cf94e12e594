"""The engine's settings, with their defaults and bounds, read at the moment of use.

Reading through `setting()` rather than at import is what lets `override_settings`
change the engine's behaviour in a test, and lets `cleanup.checks` name a bad value.
"""

from django.conf import settings

# name: (default, lowest allowed, highest allowed)
BOUNDS = {
    "EVENT_REVERT_MAX_ATTEMPTS": (3, 1, 100),
    "EVENT_REVERT_BACKOFF_S": (30, 0, 86_400),
    "EVENT_CLEANUP_RUN_BATCH": (10, 1, 10_000),
    "EVENT_CLEANUP_GROUPS_PER_RUN": (25, 1, 10_000),
    "EVENT_DEFAULT_BUDGET_MS": (10_000, 1, 600_000),
    "EVENT_CLAIM_TIMEOUT_S": (120, 1, 86_400),
    "EVENT_STEP_MAX_ATTEMPTS": (3, 1, 100),
    "EVENT_STEP_BACKOFF_S": (5, 0, 86_400),
    "EVENT_RUN_BATCH": (10, 1, 10_000),
    "EVENT_RECONCILE_LOOKBACK_S": (3600, 0, 30 * 86_400),
    "EVENT_TICK_BUDGET_S": (300, 1, 86_400),
    "EVENT_OUTAGE_AFTER": (3, 1, 1_000),
    "EVENT_OUTAGE_PROBE_S": (15, 1, 3_600),
    "EVENT_OUTAGE_GIVE_UP_S": (3_600, 1, 30 * 86_400),
    "EVENT_OUTAGE_SPREAD_S": (5, 0, 600),
    # Module calls a pass makes at once; a module may declare a lower `max_concurrency`.
    "EVENT_CALL_CONCURRENCY": (8, 1, 256),
    # How often an up backend that holds something is asked for its health (its boot id).
    "EVENT_BACKEND_WATCH_S": (60, 10, 86_400),
}

# The database CHECK on Resource.revert_attempts uses this ceiling, so no setting may
# allow more automatic attempts than the table can hold.
ATTEMPTS_CEILING = BOUNDS["EVENT_REVERT_MAX_ATTEMPTS"][2]


def setting(name):
    default = BOUNDS[name][0]
    return getattr(settings, name, default)


def max_revert_attempts():
    return setting("EVENT_REVERT_MAX_ATTEMPTS")


def claim_timeout_s():
    return setting("EVENT_CLAIM_TIMEOUT_S")


def default_budget_ms():
    return setting("EVENT_DEFAULT_BUDGET_MS")
