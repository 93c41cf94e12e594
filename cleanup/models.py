"""Runs, their steps, the ledger of what they took, and their log.

A ledger row's predicates and transitions are `cleanup.rows`'s, a run's cleanup status
`cleanup.sweep.statuses`'s: the models say what is stored, not how it changes.
May import: conf only; the engine imports the models, never the other way round.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypedDict

from django.conf import settings
from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from django.utils.safestring import SafeString

from .conf import ATTEMPTS_CEILING


class RunStatus(models.TextChoices):
    RUNNING = "running", "running"
    COMPLETED = "completed", "completed"
    CANCELLED = "cancelled", "cancelled"
    ABORTED = "aborted", "aborted"


TERMINAL = (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.ABORTED)


class CleanupStatus(models.TextChoices):
    NOT_REQUIRED = "not_required", "not required"
    PENDING = "pending", "pending"
    COMPLETE = "complete", "complete"
    INCOMPLETE = "incomplete", "incomplete"
    # Ended with its rows kept on purpose (a cancel without cleanup, rule 7): a person's
    # choice, not a cleanup that gave up, so no alert and not counted with those.
    LEFT = "left", "left for later"


class AlertedStatus(models.TextChoices):
    """What staff were last told about a run's cleanup (`cleanup.alerts`)."""

    NOTHING = "", "nothing"
    GAVE_UP = "incomplete", "gave up"
    RETRIED = "retried", "gave up, then a person retried"
    RECOVERED = "complete", "recovered"


class StepStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    # A step of a run that was cancelled or aborted before the step finished.
    CANCELLED = "cancelled", "cancelled"


class ResourceState(models.TextChoices):
    LIVE = "live", "live"
    REVERTING = "reverting", "reverting"
    REVERTED = "reverted", "reverted"
    FAILED = "failed", "failed"
    DRIFTED = "drifted", "drifted"
    ORPHANED = "orphaned", "orphaned"
    WAIVED = "waived", "waived"


RESOLVED = (ResourceState.REVERTED, ResourceState.ORPHANED, ResourceState.WAIVED)
UNRESOLVED = (
    ResourceState.LIVE,
    ResourceState.REVERTING,
    ResourceState.FAILED,
    ResourceState.DRIFTED,
)


class AttemptOutcome(models.TextChoices):
    """What came of one attempt to give a row back (`Attempt.outcome`)."""

    DONE = "done", "done"
    # The module answered, naming this ref among those it could not give back.
    FAILED = "failed", "failed"
    DRIFTED = "drifted", "drifted"
    RETRY = "retry", "retry"
    TERMINAL = "terminal", "terminal"
    # The sweeper that claimed the row stopped before it had an answer.
    EXPIRED = "expired", "expired"
    # The answer blamed the module's backend, which was down when the verdict was
    # written: the attempt was given back and the row waits for the backend.
    WAITED = "waited", "waited"
    # The answer blamed the module's backend: counted, and given back if the answers in
    # a row that blamed it mark the module down (`cleanup.outages.forgive_streak`).
    UNAVAILABLE = "unavailable", "unavailable"


class LogKind(models.TextChoices):
    """What a run's log entry records (`RunLog.kind`); the detail's keys depend on it.

    Each label is its value: people read these names in the log as they are.
    """

    RUN_STARTED = "run.started", "run.started"
    RUN_COMPLETED = "run.completed", "run.completed"
    RUN_CANCELLED = "run.cancelled", "run.cancelled"
    RUN_ABORTED = "run.aborted", "run.aborted"
    STEP_PERFORMED = "step.performed", "step.performed"
    STEP_FAILED = "step.failed", "step.failed"
    STEP_WAITING = "step.waiting", "step.waiting"
    CLEANUP_RETRY = "cleanup.retry", "cleanup.retry"
    # After every pass that attempted anything; ``detail.remaining`` says what is left.
    CLEANUP_SWEPT = "cleanup.swept", "cleanup.swept"
    # Once, when the run's cleanup turns complete: nothing of it is left unresolved.
    CLEANUP_COMPLETED = "cleanup.completed", "cleanup.completed"
    CLEANUP_REVERTED = "cleanup.reverted", "cleanup.reverted"
    CLEANUP_FAILED = "cleanup.failed", "cleanup.failed"
    CLEANUP_GAVE_UP = "cleanup.gave_up", "cleanup.gave_up"
    CLEANUP_RECOVERED = "cleanup.recovered", "cleanup.recovered"
    RESOURCE_ORPHANED = "resource.orphaned", "resource.orphaned"
    RESOURCE_WAIVED = "resource.waived", "resource.waived"
    RESOURCE_RESURRECTED = "resource.resurrected", "resource.resurrected"
    # A backend's dead-man's switch gave back what the run held there (`cleanup.deadman`).
    BACKEND_LAPSED = "backend.lapsed", "backend.lapsed"


class ModuleEventKind(models.TextChoices):
    """What the modules' log records (`ModuleEvent.kind`)."""

    DOWN = "module.down", "module.down"
    UP = "module.up", "module.up"
    GAVE_UP = "module.gave_up", "module.gave_up"
    # The backend's dead-man's switch went off: it heard nothing from the core for its ttl.
    LAPSED = "module.lapsed", "module.lapsed"


STEP_KIND = "step"
LEASE_KIND = "override"


class Run(models.Model):
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    cleanup_status = models.CharField(max_length=16, choices=CleanupStatus.choices, default=CleanupStatus.NOT_REQUIRED)
    # Off after a cancel without cleanup (rule 7): the sweep leaves the run alone until
    # a person asks for its cleanup.
    auto_cleanup = models.BooleanField(default=True)
    # When the runner should look at the run next (a `core.wait`, a step's backoff).
    wake_at = models.DateTimeField(null=True, blank=True)
    # The runner's claim on advancing the run: one ticker at a time performs its steps.
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    claim_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What staff were last told (cleanup.alerts): a transition is told once, by whoever
    # moves this with a conditional UPDATE.
    alerted_status = models.CharField(
        max_length=16, choices=AlertedStatus.choices, default=AlertedStatus.NOTHING, blank=True, editable=False
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Who started it (the actor `start_run` was given): the per-user quota counts by it.
    started_by = models.CharField(max_length=150, blank=True, default="", editable=False)

    class Meta:
        ordering = ["-id"]
        permissions = [("cleanup_run", "Can ask for a run's cleanup and waive ledger rows")]
        indexes = [
            # The runner's advance leg: running runs that are due.
            models.Index(
                fields=["wake_at"],
                name="run_running_wake_idx",
                condition=Q(status="running"),
            ),
            # cleanup.retention: ended runs, oldest first.
            models.Index(
                fields=["ended_at"],
                name="run_ended_idx",
                condition=Q(status__in=["completed", "cancelled", "aborted"]),
            ),
            # The admin's "needs attention": runs whose cleanup gave up.
            models.Index(fields=["id"], name="run_incomplete_idx", condition=Q(cleanup_status="incomplete")),
            # cleanup.sweep.statuses.repair_statuses: runs still waiting for their cleanup.
            models.Index(fields=["id"], name="run_cleanup_pending_idx", condition=Q(cleanup_status="pending")),
            # The metrics' and the admin's rows waiting for a person: runs left to a person (few).
            models.Index(fields=["id"], name="run_by_hand_idx", condition=Q(auto_cleanup=False)),
            # cleanup.alerts.notice: transitions staff have not been told about.
            models.Index(
                fields=["id"],
                name="run_alert_due_idx",
                condition=(Q(cleanup_status="incomplete") & ~Q(alerted_status="incomplete"))
                | Q(cleanup_status="complete", alerted_status__in=["incomplete", "retried"]),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


class Step(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveIntegerField()
    action_id = models.CharField(max_length=200)
    params = models.JSONField(default=dict, blank=True)
    # Which of its module's backends the step acts on (the action's `backend_of(params)`,
    # or the lease's `backend_of(target)`); "" for a module with one backend.
    backend = models.CharField(max_length=100, blank=True, default="")
    idempotency_key = models.CharField(max_length=64, unique=True, editable=False)
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # While the step waits for its backend to answer again: since when that backend is down
    # (its outage's `down_since`); null otherwise. Its own field, never text in last_error.
    waiting_since = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Never stored: why the step waits, set on the steps the admin lists (`cleanup.admin.lists.mark_waiting`).
    waiting: str | None

    class Meta:
        ordering = ["run_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="step_run_position_uniq"),
        ]

    def __str__(self) -> str:
        # As the pages count steps, from 1; the run named as its breadcrumb names it.
        return f"step {self.position + 1} of run #{self.run_id}: {self.action_id}"


class ResourceQuerySet(models.QuerySet["Resource"]):
    def unresolved(self) -> ResourceQuerySet:
        return self.filter(state__in=UNRESOLVED)

    def without_covered_placeholders(self) -> ResourceQuerySet:
        """Without the step placeholders whose step still has another unresolved row.

        A placeholder stands for its step until the step records what it made. While any
        of those rows is unresolved they are what a person reads and acts on, and the
        placeholder beside them would count the step once more. A placeholder left alone
        (its step recorded nothing, or the rest was resolved) is what still holds the
        run, so it stays.
        """
        covering = Resource.objects.filter(step=OuterRef("step"), state__in=UNRESOLVED).exclude(kind=STEP_KIND)
        return self.exclude(Q(kind=STEP_KIND) & Exists(covering))


class Resource(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="resources")
    step = models.ForeignKey(Step, on_delete=models.SET_NULL, null=True, blank=True, related_name="resources")
    module = models.CharField(max_length=100)
    # Which of the module's backends holds it: its step's, unless `perform` named another.
    backend = models.CharField(max_length=100, blank=True, default="")
    kind = models.CharField(max_length=100)
    ref = models.CharField(max_length=500)
    member_key = models.CharField(max_length=200, blank=True, default="")
    # The action that made the row, kept by the engine because a row outlives its step,
    # apart from the payload. An action row's payload is the module's, stored and
    # handed back as `perform` answered it; a lease row's payload holds the engine's
    # baseline (baseline, applied, confirmed, also_expected), written and handed down by the
    # engine, and no module receives it: `restore` gets the baseline and expected value.
    action = models.CharField(max_length=200, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=ResourceState.choices, default=ResourceState.LIVE)
    revert_attempts = models.PositiveIntegerField(default=0)
    # False after a terminal verdict (no module, `retry: false`): only a person retries it.
    retryable = models.BooleanField(default=True)
    last_error = models.TextField(blank=True, default="")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    claim_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Set just before the module is called for the current claim: an attempt is spent by
    # a call, not by a claim. A claim taken over from a sweeper that died before its call
    # gives that attempt back (`cleanup.sweep.claims`).
    claim_called = models.BooleanField(default=False, editable=False)
    # Rule 20: the call was marked called together with others of its wave. When the claim
    # dies, the call may never have started (another call of the wave took the process
    # down first): the attempt is given back, and the group is next called alone, where
    # its attempt is spent by its own call.
    claim_shared = models.BooleanField(default=False, editable=False)
    # Rule 20: the claim took the row's group over as a suspect, with the other suspects of
    # a dead sweeper's claim, called together. When this claim dies too, a call among them
    # may take its process down: its suspects are next taken over one at a time, alone.
    # A database default too: a worker of the version before, still running while the
    # migration is applied, inserts rows without it.
    claim_suspect = models.BooleanField(default=False, db_default=False, editable=False)
    # Rule 14: the row this one records again after a backend rolled back to a save.
    # One resurrection per row: two reconciles racing over the same restart cannot both
    # record it again.
    resurrected_from = models.OneToOneField(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="resurrection"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # A person's waiver, kept apart from the last error it leaves in place.
    waived_reason = models.TextField(blank=True, default="")
    waived_by = models.CharField(max_length=150, blank=True, default="")
    waived_at = models.DateTimeField(null=True, blank=True)

    objects = ResourceQuerySet.as_manager()

    # Never stored: what the admin's pages show of a row, set on the rows they list
    # (`cleanup.admin.lists.mark_waiting`, the run page).
    waiting: str | None
    attempt_text: str
    state_class: str
    state_word: str
    state_line: str
    what: str
    ref_shown: SafeString

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(revert_attempts__gte=0) & Q(revert_attempts__lte=ATTEMPTS_CEILING),
                name="resource_revert_attempts_bounds",
            ),
        ]
        indexes = [
            # cleanup.sweep.statements (finder, claim): the runs with rows to
            # claim, and a run's claimable rows.
            models.Index(
                fields=["run", "step"],
                name="res_claimable_idx",
                condition=Q(state__in=["live", "failed"], retryable=True),
            ),
            # cleanup.sweep.claims.runs_needing_cleanup: the runs that still owe something, found
            # one index probe per run (a skip scan), however much history is resolved.
            models.Index(
                fields=["run"],
                name="finder_owing_run_idx",
                condition=Q(state__in=["live", "failed", "reverting"], retryable=True),
            ),
            # cleanup.sweep.verdicts.release_spent_claims, and the claim's takeover of abandoned
            # rows: claims left behind by a sweeper that died.
            models.Index(
                fields=["claim_expires_at"],
                name="res_reverting_idx",
                condition=Q(state="reverting"),
            ),
            # cleanup.reconcile: a module's live rows.
            models.Index(fields=["module", "step"], name="res_live_module_idx", condition=Q(state="live")),
            # cleanup.reconcile after a restart: a module's recently reverted rows.
            models.Index(
                fields=["module", "resolved_at"],
                name="res_reverted_module_idx",
                condition=Q(state="reverted"),
            ),
            # cleanup.sweep.leases, rule 13: unresolved leases stacked on one target.
            models.Index(
                fields=["ref", "id"],
                name="res_open_lease_idx",
                condition=Q(kind="override", state__in=["live", "reverting", "failed", "drifted"]),
            ),
            # Status of a run: its unresolved rows.
            models.Index(
                fields=["run"],
                name="res_unresolved_idx",
                condition=Q(state__in=["live", "reverting", "failed", "drifted"]),
            ),
            # The admin's "needs attention": the oldest unresolved row, and the ledger's
            # unresolved filters, newest first, without reading resolved history.
            models.Index(
                fields=["created_at"],
                name="res_unresolved_age_idx",
                condition=Q(state__in=["live", "reverting", "failed", "drifted"]),
            ),
            models.Index(
                fields=["-id"],
                name="res_unresolved_id_idx",
                condition=Q(state__in=["live", "reverting", "failed", "drifted"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.ref}"

    @property
    def is_placeholder(self) -> bool:
        return self.kind == STEP_KIND

    @property
    def is_lease(self) -> bool:
        return self.kind == LEASE_KIND

    @property
    def action_id(self) -> str | None:
        """The action that made this row: its step's, else the one the row keeps."""
        if self.step_id is not None and self.step is not None:
            return self.step.action_id
        return self.action or None


class AttemptOf(Protocol):
    """What an attempt is recorded of: a ledger row, or the sweep's claimed copy of one."""

    @property
    def pk(self) -> int: ...
    @property
    def run_id(self) -> int: ...
    @property
    def revert_attempts(self) -> int: ...


class Attempt(models.Model):
    """One attempt to give a row back and what came of it: a row's history, read by row.

    Written in the same transaction as the verdict it records, and only for rows whose
    verdict was written (a sweeper whose claim was taken over records nothing).
    """

    resource = models.ForeignKey(Resource, on_delete=models.CASCADE, related_name="attempts")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    number = models.PositiveIntegerField()  # the row's revert_attempts for this attempt
    at = models.DateTimeField(default=timezone.now)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    error = models.TextField(blank=True, default="")
    by = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            # The admin's row page: a row's attempts, newest first.
            models.Index(fields=["resource", "-at"], name="attempt_resource_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.resource_id} #{self.number} {self.outcome}"

    @classmethod
    def record(
        cls,
        rows: Iterable[AttemptOf],
        outcome: str,
        error: str = "",
        by: str | None = "",
        at: dt.datetime | None = None,
        numbers: Mapping[int, int] | None = None,
    ) -> None:
        """One entry per row, in one insert. ``numbers`` maps row id to its attempt number."""
        at = at or timezone.now()
        numbers = numbers or {}
        Attempt.objects.bulk_create(
            Attempt(
                resource_id=r.pk,
                run_id=r.run_id,
                number=numbers.get(r.pk, r.revert_attempts),
                at=at,
                outcome=outcome,
                error=error,
                by=by or "",
            )
            for r in rows
        )


class RunLog(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="log")
    kind = models.CharField(max_length=64, choices=LogKind.choices)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    # Its place in the change feed (`cleanup.feed`), given once it is committed.
    seq = models.BigIntegerField(null=True, blank=True, unique=True, editable=False)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["run", "kind"], name="runlog_run_kind_idx"),
            # cleanup.feed.stamp: the entries not yet in the feed.
            models.Index(fields=["id"], name="runlog_unfed_idx", condition=Q(seq__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind}"

    @classmethod
    def write(cls, run_id: int, kind: str, **detail: Any) -> RunLog:
        return cls.objects.create(run_id=run_id, kind=kind, detail=detail)


class ModuleState(models.TextChoices):
    UP = "up", "up"
    DOWN = "down", "down"


class ModuleHealthQuerySet(models.QuerySet["ModuleHealth"]):
    def down(self) -> ModuleHealthQuerySet:
        return self.filter(state=ModuleState.DOWN)


class Waiting(TypedDict):
    """What work that waits on a backend says of it (`ModuleHealth.waiting`)."""

    backend: str
    since: dt.datetime | None
    reason: str


class ModuleHealth(models.Model):
    """Whether one backend of a module answers, shared by every sweeper and ticker.

    One row per ``(module, backend)``; a backend with no row has never failed and counts
    as up. Transitions are conditional UPDATEs in `cleanup.outages`; the row count says
    which worker made one, and only that worker logs it.
    """

    module = models.CharField(max_length=100)
    backend = models.CharField(max_length=100, blank=True, default="")
    state = models.CharField(max_length=8, choices=ModuleState.choices, default=ModuleState.UP)
    # Answers in a row that blamed the backend (no answer in time, refused, `unavailable`).
    failures_in_row = models.PositiveIntegerField(default=0)
    # When the current run of such answers began: answers since then are forgiven if
    # they end in the module being marked down.
    streak_started_at = models.DateTimeField(null=True, blank=True)
    # What the last counted answer was about (`cleanup.outages.record`).
    last_blamed_key = models.CharField(max_length=500, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    down_since = models.DateTimeField(null=True, blank=True)
    next_probe_at = models.DateTimeField(null=True, blank=True)
    # Set once an outage has lasted past EVENT_OUTAGE_GIVE_UP_S and its work was given up.
    gave_up_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.CharField(max_length=150, blank=True, default="")
    updated_at = models.DateTimeField(default=timezone.now)
    # The backend's boot id as its `health()` last answered it, and when it was last asked
    # (`cleanup.outages.watch`): a new boot id is a restart nobody reported.
    boot_id = models.CharField(max_length=200, blank=True, default="")
    watched_at = models.DateTimeField(null=True, blank=True)
    # A person's mark-down holds until a person marks the backend up, or until ``held_until``
    # when they set one: probes still look, and say what they saw, but do not undo it.
    held = models.BooleanField(default=False)
    held_until = models.DateTimeField(null=True, blank=True)
    # What the last probe of a down backend saw, and when (shown while a person holds it down).
    last_probe = models.CharField(max_length=500, blank=True, default="")
    last_probe_at = models.DateTimeField(null=True, blank=True)
    # Rule 14's debt: the restarts noticed on this backend (a new boot id, or its module said
    # so), and since when a reconcile is owed for them (null: none is). It is written with
    # the boot id, in one transaction; the tick pays it (`cleanup.reconcile.pay_owed`), and
    # only a reconcile that finished clears it, naming the count it read, so a restart
    # noticed meanwhile stays owed. The claim keeps two tickers off one debt, as a run's does.
    restarts_seen = models.PositiveIntegerField(default=0)
    reconcile_owed_since = models.DateTimeField(null=True, blank=True)
    reconcile_claim_token = models.UUIDField(null=True, blank=True)
    reconcile_claim_expires_at = models.DateTimeField(null=True, blank=True)

    objects = ModuleHealthQuerySet.as_manager()

    class Meta:
        ordering = ["module", "backend"]
        verbose_name_plural = "module health"
        constraints = [
            models.UniqueConstraint(fields=["module", "backend"], name="modulehealth_module_backend_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.state}"

    @property
    def name(self) -> str:
        """The module, and its backend when it has several: ``sandbox`` or ``sandbox/north``."""
        return backend_name(self.module, self.backend)

    def held_at(self, now: dt.datetime) -> bool:
        """Is a person's mark-down still holding at ``now``?"""
        return self.held and (self.held_until is None or self.held_until > now)

    def waiting(self) -> Waiting:
        """What work that waits on this backend says, as values: which backend, since when, why."""
        return {"backend": self.name, "since": self.down_since, "reason": self.last_error}

    def owed_text(self) -> str | None:
        """What a person is shown of an owed reconcile: since when, and how many restarts
        were seen; None when none is owed."""
        if self.reconcile_owed_since is None:
            return None
        since = timezone.localtime(self.reconcile_owed_since).strftime("%Y-%m-%d %H:%M:%S")
        return f"reconcile owed since {since} (after restart {self.restarts_seen} seen)"

    def waiting_text(self) -> str:
        """What a person is shown for work that waits on this backend."""
        since = timezone.localtime(self.down_since).strftime("%H:%M:%S") if self.down_since else "?"
        reason = f" ({self.last_error})" if self.last_error else ""
        return f"waiting: {self.name} is down since {since}{reason}"


def backend_name(module: str, backend: str = "") -> str:
    """How people read a module's backend: the module alone for its only backend."""
    return f"{module}/{backend}" if backend else module


class DeadmanSwitch(models.Model):
    """The core's session with one backend of a module that has ``keepalive``: the dead-man's switch.

    One row per ``(module, backend)``, made when the engine first gives the backend work
    under a session. The engine renews ``session`` at least every third of
    ``EVENT_DEADMAN_TTL_S``; a backend that hears nothing for that long gives back, by
    itself, what it holds under the session. When the core next hears that it did, the
    session is replaced by a new one with a conditional UPDATE naming the old one (the row
    count says which worker records the lapse), and ``lapses`` counts it. Written only by
    `cleanup.deadman`.
    """

    module = models.CharField(max_length=100)
    backend = models.CharField(max_length=100, blank=True, default="")
    session = models.UUIDField(default=uuid.uuid4)
    # The ttl the backend was last told, and when it last took a renewal (null: never).
    ttl_s = models.PositiveIntegerField(default=0)
    armed_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    # Why the last renewal failed; empty once one succeeds.
    last_error = models.TextField(blank=True, default="")
    lapses = models.PositiveIntegerField(default=0)
    last_lapse_at = models.DateTimeField(null=True, blank=True)
    last_lapse_reason = models.TextField(blank=True, default="")
    last_lapse_given_back = models.PositiveIntegerField(default=0)
    last_lapse_kept = models.PositiveIntegerField(default=0)
    # The renewal loop that keeps this session (`deadman.hold_loop`), and until when: a
    # loop holds its sessions for its run and a renewal past it, so at most one loop runs
    # and one that died is replaced once that passes.
    loop_token = models.UUIDField(null=True, blank=True)
    loop_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["module", "backend"]
        constraints = [
            models.UniqueConstraint(fields=["module", "backend"], name="deadmanswitch_module_backend_uniq"),
        ]

    def __str__(self) -> str:
        return f"{backend_name(self.module, self.backend)}: session {self.session}"

    @property
    def name(self) -> str:
        return backend_name(self.module, self.backend)

    @property
    def armed(self) -> bool:
        """Has the backend taken the current session (a renewal succeeded since it began)?"""
        return self.armed_at is not None


class ModuleEvent(models.Model):
    """The modules' log: a module's backend marked down or up, by the engine or by a person."""

    module = models.CharField(max_length=100)
    backend = models.CharField(max_length=100, blank=True, default="")
    kind = models.CharField(max_length=32, choices=ModuleEventKind.choices)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now)
    # Set by the one worker that wrote this change's outbox (cleanup.alerts.tell_module).
    alerted_at = models.DateTimeField(null=True, blank=True)
    # When a mail or webhook telling staff of it was accepted; null while none was (none
    # sent yet, or no destination set): only then were staff told.
    told_at = models.DateTimeField(null=True, blank=True)
    # Its place in the change feed (`cleanup.feed`), given once it is committed.
    seq = models.BigIntegerField(null=True, blank=True, unique=True, editable=False)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["module", "-at"], name="module_event_idx"),
            # cleanup.alerts.notice_modules: changes staff were not yet told of.
            models.Index(fields=["id"], name="module_event_untold_idx", condition=Q(alerted_at__isnull=True)),
            # cleanup.feed.stamp: the entries not yet in the feed.
            models.Index(fields=["id"], name="module_event_unfed_idx", condition=Q(seq__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.module} {self.kind}"


class Wake(models.Model):
    """The engine's next wake-up (`cleanup.wakeup`): one row, whose ``at`` says which time a
    queued wake task's timer already waits for, so that many runs waiting at once keep one
    timer, not one each. Moved by conditional UPDATEs; ``at`` is cleared by the task that
    woke for it."""

    at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"wake at {self.at}" if self.at else "no wake armed"


class WorkerClock(models.Model):
    """How far one cluster's clock is from the database's (`cleanup.skew`): one row per
    cluster and machine, written at its start and on each tick. Nothing decides by it:
    claims and every time that says who may act use the database's clock; a worker's own
    clock only stamps its log lines."""

    who = models.CharField(max_length=200, unique=True)
    # Seconds: the worker's clock minus the database's (positive: the worker is ahead).
    offset_s = models.FloatField()
    # The database's time of the reading.
    measured_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.who} {self.offset_s:+.1f} s"


class FeedSequence(models.Model):
    """The change feed's one counter: the highest place given so far (`cleanup.feed`).

    One row. Whoever gives places locks it first, so places are given one stamper at a
    time, each to entries already committed, in increasing order.
    """

    last = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"feed at {self.last}"


class AlertChannel(models.TextChoices):
    MAIL = "mail", "mail to ADMINS"
    WEBHOOK = "webhook", "POST to EVENT_ALERT_WEBHOOK_URL"


class Alert(models.Model):
    """The outbox: one message to deliver, written with the transition it tells.

    Delivery claims a row with a conditional UPDATE (``claimed_until``), sends outside any
    transaction, and marks it sent; a failure waits out a backoff and is tried again.
    """

    # A run's alert names its run; a module's (module.down, module.up) names its module.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alerts", null=True, blank=True)
    module = models.CharField(max_length=100, blank=True, default="")
    module_event = models.ForeignKey(
        "ModuleEvent", on_delete=models.CASCADE, related_name="alerts", null=True, blank=True
    )
    event = models.CharField(max_length=64)  # the log kind: cleanup.gave_up, cleanup.recovered, module.down, ...
    channel = models.CharField(max_length=16, choices=AlertChannel.choices)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [
            # cleanup.alerts.deliver: messages not yet sent, by when they are due.
            models.Index(fields=["next_attempt_at"], name="alert_unsent_idx", condition=Q(sent_at__isnull=True)),
        ]

    def __str__(self) -> str:
        about = f"run {self.run_id}" if self.run_id else f"module {self.module}"
        return f"{self.event} for {about} by {self.channel}"


class Counter(models.Model):
    """One counter the site's metrics show (`cleanup.counters`), shared by every process.

    Processes add to counters in memory and write the sums now and then, one upsert per
    counter, so a counter is right whichever process serves the scrape. ``key`` is the
    name with its labels, as the metrics text writes it.
    """

    key = models.CharField(max_length=500, unique=True)
    name = models.CharField(max_length=200)
    labels = models.TextField(default="{}")  # JSON, sorted keys
    value = models.FloatField(default=0)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return f"{self.key} {self.value}"


class RunTally(models.Model):
    """How many runs there are of each status and cleanup status, as changes to add up.

    Triggers on the runs table (migration 0021) append a change here for
    every run inserted, deleted, or moved to another status or cleanup status, whichever
    code or statement did it; `cleanup.tally` adds them up for the metrics in one small
    query and folds them into one row per pair now and then. Appending never waits for
    another writer, so runs changing status at once never queue on a count.
    """

    status = models.CharField(max_length=16)
    cleanup_status = models.CharField(max_length=16)
    delta = models.BigIntegerField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.status}/{self.cleanup_status} {self.delta:+d}"


class IdempotencyKeyQuerySet(models.QuerySet["IdempotencyKey"]):
    def prune(self, now: dt.datetime | None = None, limit: int = 1000) -> int:
        """Delete at most ``limit`` keys past their expiry; answers how many went."""
        now = now or timezone.now()
        ids = list(self.filter(expires_at__lt=now).order_by("expires_at").values_list("id", flat=True)[:limit])
        return self.filter(pk__in=ids, expires_at__lt=now).delete()[0] if ids else 0


class IdempotencyKey(models.Model):
    """A POST under the API sent with an ``Idempotency-Key``, and the answer it got (`cleanup.api.idempotency`).

    One row per user and key. While the first request works, ``status`` is null and
    ``token`` names that request, whose hold lasts until ``locked_until``; its answer is
    then written here, fenced by the token, and every retry with the same ``fingerprint``
    (method, path and body) until ``expires_at`` is answered from it.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    token = models.UUIDField()
    locked_until = models.DateTimeField()
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True, default="")
    body = models.TextField(blank=True, default="")
    headers = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)

    objects = IdempotencyKeyQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key_uniq")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.key}"
