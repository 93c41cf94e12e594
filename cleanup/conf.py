"""The engine's settings: every ``EVENT_*`` setting's default, bounds and meaning, in one table.
Imports only `django.conf`, so that every module of the engine, and a site's settings file,
may import it.

`SETTINGS` is that table: `cleanup.checks` checks the values against it, the site's
settings file reads each from the environment by it, and bin/settings-doc writes it into
docs/settings.md. A value is read through `setting()` at the moment of use, never at
import, so that ``override_settings`` changes the engine's behaviour in a test; a setting
that is not set is its default here, and nowhere else.
"""

from dataclasses import dataclass
from typing import Any

from django.conf import settings

# Kinds of value, as docs/settings.md names them.
INT = "whole number"
URL = "URL"
TEXT = "text"


@dataclass(frozen=True)
class Setting:
    """One engine setting.

    ``low`` and ``high`` bound a whole number, and `cleanup.checks` refuses a value outside
    them; ``None`` leaves the value unchecked. ``old_names`` are deprecated names, still read
    (as Django settings and as environment variables) while ``name`` is not set.
    """

    name: str
    default: int | str
    low: int | None
    high: int | None
    help: str
    kind: str = INT
    old_names: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The name first, then the old names, in the order `setting()` reads them."""
        return (self.name, *self.old_names)


DAY_S = 86_400
# The longest the timer of the engine's wake task waits before the task is queued again
# (`cleanup.wakeup`): a constant, not a setting. The timer is a thread; it holds no worker.
WAKE_TIMER_MAX_S = 40

SETTINGS = (
    # The cleanup pass. The database CHECK on Resource.revert_attempts is written with the
    # upper bound of EVENT_REVERT_MAX_ATTEMPTS (`ATTEMPTS_CEILING`): raising it needs a migration.
    Setting(
        "EVENT_REVERT_MAX_ATTEMPTS",
        3,
        1,
        100,
        "automatic attempts per ledger row, then it waits for a person",
    ),
    Setting("EVENT_REVERT_BACKOFF_S", 30, 0, DAY_S, "wait after a failed revert attempt, doubling each time"),
    Setting("EVENT_CLEANUP_RUN_BATCH", 10, 1, 10_000, "runs per cleanup leg"),
    Setting("EVENT_CLEANUP_GROUPS_PER_RUN", 25, 1, 10_000, "groups (revert calls) per run per pass"),
    Setting("EVENT_DEFAULT_BUDGET_MS", 10_000, 1, 600_000, "deadline of a module call without `budget_ms`"),
    Setting(
        "EVENT_CLAIM_TIMEOUT_S",
        120,
        1,
        DAY_S,
        "when a dead worker's claim may be taken over; longer than a module call (`EVENT_DEFAULT_BUDGET_MS`)",
    ),
    # Advancing runs.
    Setting("EVENT_STEP_MAX_ATTEMPTS", 3, 1, 100, "attempts per step before the run aborts"),
    Setting("EVENT_STEP_BACKOFF_S", 5, 0, DAY_S, "wait after a failed step, doubling each time"),
    Setting("EVENT_ADVANCE_RUN_BATCH", 10, 1, 10_000, "runs per advance leg", old_names=("EVENT_RUN_BATCH",)),
    Setting(
        "EVENT_RECONCILE_LOOKBACK_S",
        3600,
        0,
        30 * DAY_S,
        "after a backend restart, rows given back this recently are asked about again (rule 14)",
    ),
    Setting(
        "EVENT_TICK_BUDGET_S",
        300,
        1,
        DAY_S,
        "a tick starts no new work after this; with one module call it must end below django-q2's timeout",
    ),
    Setting(
        "EVENT_CALL_CONCURRENCY",
        8,
        1,
        256,
        "module calls a pass makes at once (a module may declare a lower `max_concurrency`)",
    ),
    # What one request may ask of the modules (cleanup.plan): live values read for a person.
    Setting(
        "EVENT_LIVE_READS_PER_REQUEST",
        50,
        1,
        500,
        "live values (lease reads) one request makes at most; the others are answered as not read",
    ),
    Setting(
        "EVENT_LIVE_READ_BUDGET_S",
        3,
        1,
        20,
        "the time all of one request's live reads share; a value not read by then is answered as not read. "
        "Keep it well below the web server's worker timeout",
    ),
    # A module's backend that is down.
    Setting("EVENT_OUTAGE_AFTER", 3, 1, 1_000, "answers in a row blaming a module's backend that mark it down"),
    Setting("EVENT_OUTAGE_PROBE_S", 15, 1, 3_600, "how often a down module is probed"),
    Setting(
        "EVENT_OUTAGE_GIVE_UP_S",
        3_600,
        1,
        30 * DAY_S,
        "an outage longer than this fails its waiting rows with the reason",
    ),
    Setting("EVENT_OUTAGE_SPREAD_S", 5, 0, 600, "a backend's waiting rows resume spread over this many seconds"),
    Setting(
        "EVENT_BACKEND_WATCH_S",
        60,
        10,
        86_400,
        "an up backend that holds live or recently given-back rows is asked for its health (its boot id) at "
        "least this often, at the tick, so a restart nobody reported is caught; the tick runs every minute",
    ),
    Setting(
        "EVENT_RECONCILES_PER_TICK",
        4,
        1,
        1_000,
        "reconciles a tick makes for backends that owe one after a restart (rule 14), oldest first, whether or "
        "not a cluster runs; the others wait for the next tick, or for the task queued when the restart was seen",
    ),
    # The dead-man's switch (cleanup.deadman, rule 34).
    Setting(
        "EVENT_DEADMAN_TTL_S",
        900,
        0,
        7 * DAY_S,
        "a backend whose module has `keepalive` gives back by itself what the core's runs took there when it hears "
        "no renewal for this long; renewed at least every third of it; 0 turns the switch off",
    ),
    # What one run may hold (cleanup.validation).
    Setting("EVENT_MAX_STEPS", 1000, None, None, "the most steps a run may have"),
    Setting("EVENT_MAX_PARAMS_BYTES", 16 * 1024, None, None, "the largest params of one step, in bytes of JSON"),
    # What runs may be running at once (cleanup.runner.start_run: a start past either is refused).
    Setting("EVENT_MAX_RUNNING_RUNS", 200, 1, 1_000_000, "runs running at once, whoever started them"),
    Setting("EVENT_MAX_RUNNING_RUNS_PER_USER", 20, 1, 1_000_000, "runs running at once that one user started"),
    # The API's safe retries (cleanup.api.idempotency).
    Setting(
        "EVENT_IDEMPOTENCY_TTL_S",
        DAY_S,
        60,
        30 * DAY_S,
        "how long the answer to a POST with an `Idempotency-Key` is replayed to its retries; the tick prunes "
        "older keys",
    ),
    # Telling staff (cleanup.alerts).
    Setting(
        "EVENT_ALERT_WEBHOOK_URL", "", None, None, "where alerts are POSTed as JSON (none are when empty)", kind=URL
    ),
    Setting(
        "EVENT_ALERT_WEBHOOK_SECRET",
        "",
        None,
        None,
        "signs each webhook delivery (`X-Eventsite-Signature`, docs/api.md); unsigned when empty",
        kind=TEXT,
    ),
    Setting(
        "EVENT_ALERT_WEBHOOK_TIMEOUT_S", 3, None, None, "how long a webhook may take before it is tried again later"
    ),
    Setting(
        "EVENT_SITE_URL", "", None, None, "the start of links in alerts, such as `https://events.example.com`", kind=URL
    ),
    # Retention (cleanup.retention): what ended long ago is deleted, in bounded batches.
    Setting(
        "EVENT_RETENTION_DAYS",
        90,
        0,
        36_500,
        "runs that ended this many days ago with nothing unresolved are deleted with their ledger; also the "
        "bound on sent alerts and the modules' log; 0 keeps everything",
    ),
    Setting("EVENT_PRUNE_BATCH", 500, 1, 10_000, "runs deleted per batch (one short transaction each)"),
    # The site's metrics (cleanup.metrics, `GET /metrics`).
    Setting(
        "EVENT_METRICS_TOKEN",
        "",
        None,
        None,
        "a scrape of the metrics must send `Authorization: Bearer` this; empty: only from loopback",
        kind=TEXT,
    ),
    Setting(
        "EVENT_METRICS_NAMESPACE",
        "events",
        None,
        None,
        "the first word of every metric's name (`events_ledger_rows`); the example site sets its own name",
        kind=TEXT,
    ),
    # The admin's pages that stay current (cleanup/static/cleanup/live.js).
    Setting(
        "EVENT_ADMIN_REFRESH_S",
        5,
        1,
        3_600,
        "how often an open admin page (the index, a run, the ledger) reads its counts and rows again, while live",
    ),
    # Who may get in (cleanup.admin.lockout, cleanup.api.tokens) and what is mailed (cleanup.errormail).
    Setting(
        "EVENT_LOGIN_FAILURE_LIMIT",
        5,
        1,
        1_000,
        "failed logins for one username from one client address after which that username is locked out "
        "from that address, even with the right password (other addresses are not)",
    ),
    Setting(
        "EVENT_LOGIN_ADDRESS_FAILURE_LIMIT",
        20,
        1,
        100_000,
        "failed logins from one client address, whatever the usernames, after which every login from it "
        "is refused for `EVENT_LOGIN_COOLOFF_S`",
    ),
    Setting(
        "EVENT_LOGIN_COOLOFF_S",
        900,
        1,
        30 * DAY_S,
        "how long a locked-out username (from one address), or a locked-out address, stays locked out",
    ),
    Setting("EVENT_TOKEN_TTL_DAYS", 30, 1, 3_650, "an API token made without `--ttl` expires after this many days"),
    Setting(
        "EVENT_TOKEN_FAILURE_LIMIT",
        20,
        1,
        100_000,
        "failed token authentications within `EVENT_TOKEN_FAILURE_WINDOW_S` from one client address "
        "with one key prefix, after which that prefix is answered 429 there; as many from one address, "
        "and only keys with a stored token's prefix are still tried from it",
    ),
    Setting(
        "EVENT_TOKEN_AUTH_MEMORY_S",
        5,
        0,
        60,
        "how long a process that does not listen to the change feed remembers a token it authenticated (its "
        "user and permissions) before it asks the database again; a revoked token or a changed permission "
        "holds at once in the process that made the change, within this many seconds in such a process; "
        "0 asks every time, in every process",
    ),
    Setting(
        "EVENT_TOKEN_AUTH_WATCHED_S",
        60,
        1,
        3_600,
        "the same for a process whose change feed listens (an ASGI worker that served the feed): a token "
        "revoked, a user saved or a permission changed anywhere on the site empties its memory when "
        "committed; a change made without Django's signals (SQL) holds within this many seconds",
    ),
    Setting("EVENT_TOKEN_FAILURE_WINDOW_S", 60, 1, DAY_S, "the window `EVENT_TOKEN_FAILURE_LIMIT` counts failures in"),
    Setting(
        "EVENT_ERROR_MAIL_INTERVAL_S",
        300,
        0,
        DAY_S,
        "one error mail per distinct error (its kind and where it was raised) within this many seconds",
    ),
    # The site's probe (/healthz). The tick is due every minute: a few missed ones are a
    # slow worker, more is no worker.
    Setting(
        "EVENT_HEALTH_STALE_S",
        300,
        None,
        None,
        "`/healthz` answers 503 when no cluster finished a tick within this many seconds",
    ),
)

# Each name, and each old name, to its setting.
BY_NAME = {name: entry for entry in SETTINGS for name in entry.names}

# The database CHECK on Resource.revert_attempts uses this ceiling, so no setting may
# allow more automatic attempts than the table can hold.
ATTEMPTS_CEILING = BY_NAME["EVENT_REVERT_MAX_ATTEMPTS"].high

_UNSET = object()


def setting(name: str) -> Any:
    """The value of an engine setting now: the Django setting of its name, else of an old
    name, else its default. An old name reads the same. A name not in `SETTINGS` is a KeyError."""
    entry = BY_NAME[name]
    for candidate in entry.names:
        value = getattr(settings, candidate, _UNSET)
        if value is not _UNSET:
            return value
    return entry.default


def max_revert_attempts() -> int:
    attempts: int = setting("EVENT_REVERT_MAX_ATTEMPTS")
    return attempts


def claim_timeout_s() -> int:
    seconds: int = setting("EVENT_CLAIM_TIMEOUT_S")
    return seconds


def default_budget_ms() -> int:
    budget: int = setting("EVENT_DEFAULT_BUDGET_MS")
    return budget


def markdown_table() -> str:
    """`SETTINGS` as the Markdown table of docs/settings.md, which bin/settings-doc writes there."""
    lines = ["| setting | default | accepts | meaning |", "| --- | --- | --- | --- |"]
    for entry in SETTINGS:
        was = "".join(f" (was `{old}`, still read when this is not set)" for old in entry.old_names)
        lines.append(f"| `{entry.name}` | {_shown(entry.default)} | {_accepts(entry)} | {entry.help}{was} |")
    return "\n".join(lines) + "\n"


def _shown(default: int | str) -> str:
    return f"`{default}`" if default != "" else "empty"


def _accepts(entry: Setting) -> str:
    if entry.kind == INT and entry.low is not None:
        return f"{entry.low} to {entry.high}"
    if entry.kind in (URL, TEXT):
        return f"{entry.kind}, empty for none"
    return f"{entry.kind} (not checked)"
