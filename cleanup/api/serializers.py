"""What the API reads and writes: small input serializers, and the engine's objects out.

May import: the models, conf, `cleanup.rows`, `outages`, `validation`, `plan` (its codes) and the API's errors.
"""

import datetime as dt
from typing import Any, cast

from django.db.models import Choices
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import outages, validation
from .. import rows as ledger_rows
from ..conf import max_revert_attempts
from ..models import (
    CleanupStatus,
    ModuleEvent,
    ModuleHealth,
    ModuleState,
    Resource,
    ResourceState,
    Run,
    RunLog,
    RunStatus,
    Step,
    Waiting,
)
from ..plan import NEXT_CODES
from .errors import CODE_CHOICES

NULLABLE_TEXT = {"type": "string", "nullable": True}
# Any JSON value: a string, a number, true or false, an object, an array, or null.
JSON_VALUE = {
    "nullable": True,
    "anyOf": [
        {"type": "string"},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "object", "additionalProperties": {}},
        {"type": "array", "items": {}},
    ],
}
JSON_OBJECT = {"type": "object", "additionalProperties": {}}


@extend_schema_field(JSON_VALUE)
class JsonValueField(serializers.JSONField):
    """Any JSON value, as stored (a lease's baseline, the value it applied, a value read live)."""


@extend_schema_field(JSON_OBJECT)
class JsonObjectField(serializers.JSONField):
    """A JSON object whose keys depend on the kind of thing (a payload, a step's params, a log's detail)."""


class StrictBooleanField(serializers.BooleanField):
    """JSON ``true`` or ``false`` only: ``"yes"``, ``1`` or ``"false"`` are refused, not guessed at."""

    def to_internal_value(self, data: object) -> bool:
        if data is True or data is False:
            return data
        self.fail("invalid", input=data)


class StrictCharField(serializers.CharField):
    """A JSON string only (``5`` is not taken as ``"5"``), checked by `cleanup.validation`."""

    def to_internal_value(self, data: object) -> str:
        if not isinstance(data, str):
            self.fail("invalid_type", type=validation.json_type(data))
        if message := validation.text_error(data, self.max_length or validation.MAX_REASON):
            raise serializers.ValidationError(message)
        return super().to_internal_value(data)

    default_error_messages = {"invalid_type": "must be a string, not {type}"}


# -- in -------------------------------------------------------------------------------


class StrictSerializer(serializers.Serializer[Any]):
    """A request body: a JSON object whose every field is one the endpoint knows."""

    def to_internal_value(self, data: Any) -> Any:  # the request's body, whatever JSON it is
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({field: ["unknown field"] for field in unknown})
        return super().to_internal_value(data)


class EmptySerializer(StrictSerializer):
    """No body, or an empty object."""


class StepSpecSerializer(serializers.Serializer[Any]):
    action = StrictCharField(
        max_length=validation.MAX_ACTION,
        help_text='An action a module registers, such as "core.wait"; another answers 400 naming steps[i].action.',
    )
    params = serializers.DictField(
        required=False,
        help_text="The action's parameters (default {}): JSON nested at most 32 levels, its keys and strings "
        "clean text, whole numbers within 64 bits, at most EVENT_MAX_PARAMS_BYTES; the action checks the "
        "rest and a refusal names steps[i].params.",
    )


class RunStartSerializer(StrictSerializer):
    """The body that starts a run, for the schema.

    `cleanup.runner.validate_spec` is what checks it, so a client sees the engine's own
    field messages, keyed like ``steps[1].action``.
    """

    name = StrictCharField(max_length=validation.MAX_NAME, help_text="What people call the run; clean text.")
    steps = StepSpecSerializer(
        many=True, allow_empty=False, help_text="What the run does, in order: 1 to EVENT_MAX_STEPS steps."
    )


class CancelSerializer(StrictSerializer):
    cleanup = StrictBooleanField(
        default=True,
        help_text="Give back what the run took (default). false leaves its rows for a person (rule 7).",
    )


class WaiveSerializer(StrictSerializer):
    reason = StrictCharField(
        max_length=validation.MAX_REASON, help_text="Why nothing is given back; logged with the actor."
    )


class MarkDownSerializer(StrictSerializer):
    reason = StrictCharField(
        max_length=validation.MAX_REASON,
        help_text="Why the backend is out; shown beside the work that waits, and logged with the actor.",
    )
    until = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="When the hold ends by itself (ISO 8601, in the future). Without it the backend stays "
        "down until a person marks it up: probes only say what they see.",
    )

    def validate_until(self, value: dt.datetime | None) -> dt.datetime | None:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("until must be in the future.")
        return value


class CleanupSerializer(StrictSerializer):
    reset = StrictBooleanField(
        default=True,
        help_text="Put the run's unresolved rows back under the attempt ceiling first (default, rule 6); "
        "false: a pass now, counters kept.",
    )


# The most row ids one waiver may name; "all" names every unresolved row of the run.
MAX_WAIVE_ROWS = 1000
MAX_ID = 2**63 - 1


@extend_schema_field(
    {
        "oneOf": [
            {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                "minItems": 1,
                "maxItems": MAX_WAIVE_ROWS,
            },
            {"type": "string", "enum": ["all"]},
        ]
    }
)
class RowsField(serializers.Field[str | list[int], object, str | list[int], Any]):
    """``"all"``, or a list of row ids (at most `MAX_WAIVE_ROWS`)."""

    def to_internal_value(self, data: object) -> str | list[int]:
        if data == "all":
            return "all"
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError('"all", or a list of row ids')
        if len(data) > MAX_WAIVE_ROWS:
            raise serializers.ValidationError(f'at most {MAX_WAIVE_ROWS} row ids, got {len(data)}; or "all"')
        bad = [v for v in data if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_ID]
        if bad:
            raise serializers.ValidationError(f"row ids are whole numbers from 1 to {MAX_ID}, got {bad[0]!r}")
        return sorted(set(data))

    def to_representation(self, value: str | list[int]) -> str | list[int]:
        return value


class RunWaiveSerializer(StrictSerializer):
    reason = StrictCharField(
        max_length=validation.MAX_REASON, help_text="Why nothing is given back; logged with the actor."
    )
    rows = RowsField(
        help_text='The run\'s rows to waive: their ids (a row of another run is refused, 400 naming it), or "all" '
        "for every unresolved row."
    )


class ReconcileSerializer(StrictSerializer):
    restarted = StrictBooleanField(
        default=False,
        help_text="As after a backend restart: also ask about recently given-back resources.",
    )


# -- out ------------------------------------------------------------------------------


BACKEND_HELP = "Which of its module's backends it acts on; \"\" for a module's only backend."


class WaitingSerializer(serializers.Serializer[Waiting]):
    """A ledger row waiting for its backend: its own state, never text in ``last_error``."""

    backend = serializers.CharField(help_text='The backend it waits for, as people read it: "sandbox/south".')
    since = serializers.DateTimeField(allow_null=True, help_text="When the backend went down.")
    reason = serializers.CharField(help_text="The last answer that blamed the backend, or a person's reason.")


class StepSerializer(serializers.ModelSerializer[Step]):
    action = serializers.CharField(source="action_id")
    backend = serializers.CharField(read_only=True, help_text=BACKEND_HELP)
    params = JsonObjectField(read_only=True, help_text="The action's parameters, as the run was started with.")
    waiting = serializers.SerializerMethodField(
        help_text="While the step waits for its backend to answer again: which backend, since when and why; "
        "null otherwise (never text in last_error)."
    )

    class Meta:
        model = Step
        fields = [
            "id",
            "position",
            "action",
            "backend",
            "params",
            "idempotency_key",
            "status",
            "attempts",
            "last_error",
            "next_attempt_at",
            "waiting",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, step: Step) -> dict[str, Any] | None:
        health: ModuleHealth | None = outages.step_waits_on(step)
        return WaitingSerializer(health.waiting()).data if health else None


class RunSerializer(serializers.ModelSerializer[Run]):
    unresolved = serializers.IntegerField(read_only=True, help_text="Ledger rows not yet resolved.")

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "status",
            "cleanup_status",
            "auto_cleanup",
            "unresolved",
            "created_at",
            "updated_at",
            "ended_at",
        ]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    steps = StepSerializer(many=True, read_only=True)

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "steps"]
        read_only_fields = fields


class WaitingListSerializer(serializers.ListSerializer[Resource]):
    """Reads the down backends of a whole page in one query, for the rows' ``waiting``."""

    def to_representation(self, data: Any) -> list[Any]:  # a page of rows: a manager, a queryset or a list
        rows = list(data.all() if hasattr(data, "all") else data)
        # DRF's context is the dict the view passed (a Mapping to the stubs): the rows read it.
        cast(dict[str, Any], self.context)["waiting"] = (
            outages.waiting_on({(r.module, r.backend) for r in rows}) if rows else {}
        )
        return super().to_representation(rows)


class ResourceSerializer(serializers.ModelSerializer[Resource]):
    backend = serializers.CharField(read_only=True, help_text=BACKEND_HELP)
    payload = JsonObjectField(read_only=True, help_text="What the module answered of it (a lease: baseline, applied).")
    waiting = serializers.SerializerMethodField(
        help_text="While its own backend is down and the sweep would otherwise try it: which backend, since when "
        "and why; null otherwise."
    )
    retryable = serializers.SerializerMethodField(
        help_text="Whether the automatic sweep will try it again: false once it has no attempt left, is "
        "terminal, or resolved."
    )
    next_attempt_at = serializers.SerializerMethodField(
        help_text="When the sweep tries it next; null when it will not (no attempt left, resolved, not retryable)."
    )

    class Meta:
        model = Resource
        fields = [
            "id",
            "run",
            "step",
            "module",
            "backend",
            "action",
            "kind",
            "ref",
            "member_key",
            "payload",
            "state",
            "revert_attempts",
            "retryable",
            "last_error",
            "next_attempt_at",
            "waiting",
            "resurrected_from",
            "created_at",
            "updated_at",
            "resolved_at",
            "waived_reason",
            "waived_by",
            "waived_at",
        ]
        read_only_fields = fields
        list_serializer_class = WaitingListSerializer

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, row: Resource) -> dict[str, Any] | None:
        key = (row.module, row.backend)
        down: dict[tuple[str, str], ModuleHealth] | None = self.context.get("waiting")
        if down is None:
            down = outages.waiting_on([key])
        health = down.get(key)
        if health is None or not ledger_rows.holds(row, ledger_rows.awaits_sweep(max_revert_attempts())):
            return None
        return WaitingSerializer(health.waiting()).data

    def _tried_again(self, row: Resource) -> bool:
        """Will the sweep still try the row (`rows.tried_again`): what ``retryable`` says (rule 33)."""
        return ledger_rows.holds(row, ledger_rows.tried_again(timezone.now(), max_revert_attempts()))

    @extend_schema_field(serializers.BooleanField())
    def get_retryable(self, row: Resource) -> bool:
        return self._tried_again(row)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_attempt_at(self, row: Resource) -> str | None:
        if row.next_attempt_at is None or not self._tried_again(row):
            return None
        return serializers.DateTimeField().to_representation(row.next_attempt_at)


class SwitchSerializer(serializers.Serializer[Any]):
    """A backend's dead-man's switch (rule 34)."""

    armed = serializers.BooleanField(help_text="Whether the backend holds a live session from the core.")
    ttl_s = serializers.IntegerField(help_text="The ttl the backend was last told, in seconds.")
    session = serializers.CharField(help_text="The session's id.")
    renewed_at = serializers.DateTimeField(allow_null=True, help_text="Its last renewal; null when never.")
    last_error = serializers.CharField(help_text='Why the last renewal failed; "" when it did not.')
    holdings = serializers.IntegerField(help_text="What the backend holds under the session: unresolved ledger rows.")
    lapses = serializers.IntegerField(help_text="How often its switch went off and gave back by itself.")
    last_lapse_at = serializers.DateTimeField(allow_null=True, help_text="When the core heard of the last lapse.")
    last_lapse_reason = serializers.CharField(help_text='The last lapse as staff read it; "" when none.')


class BackendHealthSerializer(serializers.Serializer[Any]):
    module = serializers.CharField()
    backend = serializers.CharField(help_text='The backend; "" for the module\'s only backend.')
    name = serializers.CharField(help_text='How people read it: "sandbox/north", or the module alone for "".')
    registered = serializers.BooleanField(help_text="Whether a module of this name is installed now.")
    state = serializers.ChoiceField(choices=ModuleState.choices)
    since = serializers.DateTimeField(allow_null=True, help_text="When it went down; null while up.")
    last_error = serializers.CharField(help_text="The last answer that blamed the backend, or a person's reason.")
    failures_in_row = serializers.IntegerField(help_text="Answers in a row that blamed the backend.")
    next_probe_at = serializers.DateTimeField(allow_null=True, help_text="While down: when it is probed next.")
    changed_by = serializers.CharField(help_text='Who marked it last: "engine", "probe" or a person.')
    boot_id = serializers.CharField(help_text='The boot id its health() last answered; "" when none was.')
    restarts_seen = serializers.IntegerField(
        help_text="Restarts noticed on this backend: a new boot id, or its module said so."
    )
    reconcile_owed_since = serializers.DateTimeField(
        allow_null=True,
        help_text="Since when a reconcile is owed after a restart (rule 14), until one finishes; null when none is.",
    )
    waiting = serializers.CharField(allow_null=True, help_text="What its waiting work shows; null while up.")
    switch = SwitchSerializer(
        allow_null=True, help_text="Its dead-man's switch (rule 34); null when the backend keeps none."
    )


class ModuleHealthSerializer(serializers.Serializer[Any]):
    """A module: the fields of its only backend ``""`` (as before backends), and every backend."""

    module = serializers.CharField()
    registered = serializers.BooleanField(help_text="Whether a module of this name is installed now.")
    state = serializers.ChoiceField(choices=ModuleState.choices, help_text='Of its backend "".')
    since = serializers.DateTimeField(allow_null=True, help_text='When its backend "" went down; null while up.')
    last_error = serializers.CharField(help_text='The last answer that blamed its backend "", or a person\'s reason.')
    failures_in_row = serializers.IntegerField(help_text='Answers in a row that blamed its backend "".')
    next_probe_at = serializers.DateTimeField(allow_null=True, help_text='While "" is down: when it is probed next.')
    changed_by = serializers.CharField(help_text='Who marked its backend "" last: "engine", "probe" or a person.')
    boot_id = serializers.CharField(help_text='The boot id its backend "" last answered.')
    restarts_seen = serializers.IntegerField(help_text='Restarts noticed on its backend "".')
    reconcile_owed_since = serializers.DateTimeField(
        allow_null=True, help_text='Since when its backend "" owes a reconcile after a restart; null when none is.'
    )
    waiting = serializers.CharField(allow_null=True, help_text='What the work of "" shows; null while up.')
    backends = BackendHealthSerializer(
        many=True,
        help_text='Each backend with a health row or unresolved ledger rows, "" first; each is marked down, up and '
        "reconciled on its own (modules/{name}/backends/{backend}/...).",
    )


class ModuleEventSerializer(serializers.ModelSerializer[ModuleEvent]):
    backend = serializers.CharField(read_only=True, help_text='The backend; "" for the module\'s only backend.')
    detail = JsonObjectField(read_only=True, help_text="The entry's details; its keys depend on its kind.")

    class Meta:
        model = ModuleEvent
        fields = ["id", "module", "backend", "kind", "detail", "at", "alerted_at", "told_at"]
        extra_kwargs = {
            "alerted_at": {"help_text": "When its alert was written to the outbox (or found nowhere to go)."},
            "told_at": {"help_text": "When a mail or webhook telling staff of it was accepted; null until then."},
        }
        read_only_fields = fields


class ModuleDownSerializer(serializers.Serializer[Any]):
    module = serializers.CharField()
    backend = serializers.CharField(help_text='"" for the module\'s only backend.')
    name = serializers.CharField(help_text='"sandbox/north", or the module alone.')
    since = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField()
    waiting = serializers.CharField()


class RunLogSerializer(serializers.ModelSerializer[RunLog]):
    detail = JsonObjectField(read_only=True, help_text="The entry's details; its keys depend on its kind.")

    class Meta:
        model = RunLog
        fields = ["id", "run", "kind", "detail", "at"]
        read_only_fields = fields


AFTER_HELP = (
    "The change feed's position before this request's work: what it does is listed after it (changes/?after=this)."
)


class CleanupQueuedSerializer(serializers.Serializer[Any]):
    run = RunSerializer()
    reset = serializers.IntegerField(help_text="Unresolved rows put back under the attempt ceiling (0 without reset).")
    queued = serializers.BooleanField()
    after = serializers.IntegerField(help_text=AFTER_HELP)


class RunWaivedSerializer(serializers.Serializer[Any]):
    run = RunSerializer()
    waived = serializers.IntegerField(help_text="Rows waived by this request.")
    after = serializers.IntegerField(help_text=AFTER_HELP)


class ReconcileQueuedSerializer(serializers.Serializer[Any]):
    module = serializers.CharField()
    restarted = serializers.BooleanField()
    queued = serializers.BooleanField()
    after = serializers.IntegerField(help_text=AFTER_HELP)


class BackendReconcileQueuedSerializer(ReconcileQueuedSerializer):
    backend = serializers.CharField(help_text="The one backend whose rows are reconciled.")


class PlanHeirSerializer(serializers.Serializer[Any]):
    resource = serializers.IntegerField(help_text="The newer lease's ledger row.")
    run = serializers.IntegerField(help_text="Its run.")


class PlanLiveSerializer(serializers.Serializer[Any]):
    value = JsonValueField(required=False, help_text="The value in force now, when it could be read.")
    error = serializers.CharField(required=False, help_text="Why it could not be read.")
    unread = serializers.CharField(
        required=False,
        help_text="Why it was not read: past EVENT_LIVE_READS_PER_REQUEST, or EVENT_LIVE_READ_BUDGET_S ran out first.",
    )


class PlanLeaseSerializer(serializers.Serializer[Any]):
    baseline = JsonValueField(help_text="The value before the lease, to be restored.")
    applied = JsonValueField(help_text="The value this run applied.")
    hand_down_to = PlanHeirSerializer(allow_null=True, help_text="The newer lease that inherits the baseline.")
    live = PlanLiveSerializer(
        required=False,
        help_text='With ?live=1: {"value"} read now, {"error"} when the read failed, or {"unread"} saying why it '
        "was not read (past EVENT_LIVE_READS_PER_REQUEST, or EVENT_LIVE_READ_BUDGET_S ran out).",
    )


class PlanRowSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    kind = serializers.CharField(help_text='What the module calls it ("creature"); "override" for a lease.')
    ref = serializers.CharField()
    state = serializers.ChoiceField(choices=ResourceState.choices)
    attempts = serializers.IntegerField()
    attempts_left = serializers.IntegerField()
    last_error = serializers.CharField()
    lease = PlanLeaseSerializer(required=False, help_text="Lease rows only.")


class NextField(serializers.ChoiceField):
    """The plan's verdict on a group (`cleanup.plan`'s words for people) as its code."""

    def to_representation(self, value: str) -> str:
        return NEXT_CODES[value]


class PlanGroupSerializer(serializers.Serializer[Any]):
    next = NextField(
        choices=list(NEXT_CODES.values()),
        help_text="What the next pass does: restore (a lease's baseline), hand_down (to a newer lease), "
        "revert, leave_drifted (someone else's value is in place), waiting_for_person (no attempt left, or "
        "nothing can give it back), waiting_for_backend (its backend is down) or being_given_back (now).",
    )
    verb = serializers.CharField(allow_null=True, help_text="The call that gives the group back, or null.")
    problem = serializers.CharField(allow_null=True, help_text="Why no call can, or null.")
    rows = PlanRowSerializer(many=True)


class CleanupPlanSerializer(serializers.Serializer[Any]):
    run = serializers.IntegerField()
    next = serializers.URLField(allow_null=True, help_text="The next page of groups, null on the last.")
    previous = serializers.URLField(allow_null=True, help_text="The page before, null on the first.")
    groups = PlanGroupSerializer(many=True, help_text="This page's groups: leases, then steps' rows, then loose rows.")
    unread = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="With ?live=1: the ids of the lease rows whose live value was not read in this request.",
    )


def counts_by(name: str, choices: type[Choices]) -> type[serializers.Serializer[Any]]:
    """A serializer with one count per choice, each a named property: a client reads
    ``summary.runs.status.running``, not a key it has to know."""
    fields = {value: serializers.IntegerField(help_text=f"How many are {value}.") for value in choices.values}
    return type(name, (serializers.Serializer,), fields)


RunStatusCountsSerializer = counts_by("RunStatusCountsSerializer", RunStatus)
CleanupStatusCountsSerializer = counts_by("CleanupStatusCountsSerializer", CleanupStatus)
ResourceStateCountsSerializer = counts_by("ResourceStateCountsSerializer", ResourceState)


class RunCountsSerializer(serializers.Serializer[Any]):
    total = serializers.IntegerField()
    status = RunStatusCountsSerializer(help_text="Runs counted by status, every status present.")
    cleanup_status = CleanupStatusCountsSerializer(help_text="Runs counted by cleanup status, every one present.")


class ResourceCountsSerializer(serializers.Serializer[Any]):
    total = serializers.IntegerField()
    state = ResourceStateCountsSerializer(help_text="Ledger rows counted by state, every state present.")
    unresolved = serializers.IntegerField()


class SummarySerializer(serializers.Serializer[Any]):
    runs = RunCountsSerializer()
    resources = ResourceCountsSerializer()
    modules_down = ModuleDownSerializer(many=True, help_text="Each backend down, by module: its work waits.")


class ErrorSerializer(serializers.Serializer[Any]):
    """Every error under the API: a stable code, a sentence, and the fields at fault if any."""

    code = serializers.ChoiceField(
        choices=CODE_CHOICES, help_text="Stable: branch on it (docs/api.md lists each code and its status)."
    )
    detail = serializers.CharField(help_text="A sentence for a person; it may be reworded.")
    # A declared field: DRF's metaclass takes it off the class, so ``.errors`` stays the serializer's.
    errors = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text='Each field or query parameter at fault ("steps[1].action", "live") with its messages.',
    )
