"""What the API reads and writes: small input serializers, and the engine's objects out.

May import: the models, conf, `outages`, `validation`.
"""

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import outages, validation
from ..conf import max_revert_attempts
from ..models import ModuleEvent, Resource, Run, RunLog, Step

NULLABLE_TEXT = {"type": "string", "nullable": True}


class StrictBooleanField(serializers.BooleanField):
    """JSON ``true`` or ``false`` only: ``"yes"``, ``1`` or ``"false"`` are refused, not guessed at."""

    def to_internal_value(self, data):
        if data is True or data is False:
            return data
        self.fail("invalid", input=data)


class StrictCharField(serializers.CharField):
    """A JSON string only (``5`` is not taken as ``"5"``), checked by `cleanup.validation`."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_type", type=validation.json_type(data))
        if message := validation.text_error(data, self.max_length or validation.MAX_REASON):
            raise serializers.ValidationError(message)
        return super().to_internal_value(data)

    default_error_messages = {"invalid_type": "must be a string, not {type}"}


# -- in -------------------------------------------------------------------------------


class StrictSerializer(serializers.Serializer):
    """A request body: a JSON object whose every field is one the endpoint knows."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({field: ["unknown field"] for field in unknown})
        return super().to_internal_value(data)


class EmptySerializer(StrictSerializer):
    """No body, or an empty object."""


class StepSpecSerializer(serializers.Serializer):
    action = serializers.CharField(help_text='A registered action, such as "core.wait".')
    params = serializers.DictField(required=False, help_text="The action's parameters (default {}).")


class RunStartSerializer(StrictSerializer):
    """The body that starts a run, for the schema.

    `cleanup.runner.validate_spec` is what checks it, so a client sees the engine's own
    field messages, keyed like ``steps[1].action``.
    """

    name = serializers.CharField(max_length=200)
    steps = StepSpecSerializer(many=True)


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

    def validate_until(self, value):
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("until must be in the future.")
        return value


class ReconcileSerializer(StrictSerializer):
    restarted = StrictBooleanField(
        default=False,
        help_text="As after a backend restart: also ask about recently given-back resources.",
    )


# -- out ------------------------------------------------------------------------------


BACKEND_HELP = "Which of its module's backends it acts on; \"\" for a module's only backend."


class StepSerializer(serializers.ModelSerializer):
    action = serializers.CharField(source="action_id")
    backend = serializers.CharField(read_only=True, help_text=BACKEND_HELP)

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
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class RunSerializer(serializers.ModelSerializer):
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


class WaitingListSerializer(serializers.ListSerializer):
    """Reads the down backends of a whole page in one query, for the rows' ``waiting``."""

    def to_representation(self, data):
        rows = list(data.all() if hasattr(data, "all") else data)
        self.context["waiting"] = outages.waiting_reasons({(r.module, r.backend) for r in rows}) if rows else {}
        return super().to_representation(rows)


class ResourceSerializer(serializers.ModelSerializer):
    backend = serializers.CharField(read_only=True, help_text=BACKEND_HELP)
    waiting = serializers.SerializerMethodField(
        help_text='Why the sweep does not try the row now: "waiting: <module>[/<backend>] is down since <time> '
        '(<error>)"; null unless its own backend is down.'
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

    @extend_schema_field(NULLABLE_TEXT)
    def get_waiting(self, row):
        key = (row.module, row.backend)
        reasons = self.context.get("waiting")
        if reasons is None:
            reasons = outages.waiting_reasons([key])
        reason = reasons.get(key)
        return reason if reason and outages.row_waits(row, max_revert_attempts()) else None


class BackendHealthSerializer(serializers.Serializer):
    module = serializers.CharField()
    backend = serializers.CharField(help_text='The backend; "" for the module\'s only backend.')
    name = serializers.CharField(help_text='How people read it: "sandbox/north", or the module alone for "".')
    registered = serializers.BooleanField(help_text="Whether a module of this name is installed now.")
    state = serializers.ChoiceField(choices=["up", "down"])
    since = serializers.DateTimeField(allow_null=True, help_text="When it went down; null while up.")
    last_error = serializers.CharField(help_text="The last answer that blamed the backend, or a person's reason.")
    failures_in_row = serializers.IntegerField(help_text="Answers in a row that blamed the backend.")
    next_probe_at = serializers.DateTimeField(allow_null=True, help_text="While down: when it is probed next.")
    changed_by = serializers.CharField(help_text='Who marked it last: "engine", "probe" or a person.')
    boot_id = serializers.CharField(help_text='The boot id its health() last answered; "" when none was.')
    waiting = serializers.CharField(allow_null=True, help_text="What its waiting work shows; null while up.")


class ModuleHealthSerializer(serializers.Serializer):
    """A module: the fields of its only backend ``""`` (as before backends), and every backend."""

    module = serializers.CharField()
    registered = serializers.BooleanField(help_text="Whether a module of this name is installed now.")
    state = serializers.ChoiceField(choices=["up", "down"], help_text='Of its backend "".')
    since = serializers.DateTimeField(allow_null=True, help_text='When its backend "" went down; null while up.')
    last_error = serializers.CharField(help_text='The last answer that blamed its backend "", or a person\'s reason.')
    failures_in_row = serializers.IntegerField(help_text='Answers in a row that blamed its backend "".')
    next_probe_at = serializers.DateTimeField(allow_null=True, help_text='While "" is down: when it is probed next.')
    changed_by = serializers.CharField(help_text='Who marked its backend "" last: "engine", "probe" or a person.')
    boot_id = serializers.CharField(help_text='The boot id its backend "" last answered.')
    waiting = serializers.CharField(allow_null=True, help_text='What the work of "" shows; null while up.')
    backends = BackendHealthSerializer(
        many=True,
        help_text='Each backend with a health row or unresolved ledger rows, "" first; each is marked down, up and '
        "reconciled on its own (modules/{name}/backends/{backend}/...).",
    )


class ModuleEventSerializer(serializers.ModelSerializer):
    backend = serializers.CharField(read_only=True, help_text='The backend; "" for the module\'s only backend.')

    class Meta:
        model = ModuleEvent
        fields = ["id", "module", "backend", "kind", "detail", "at", "alerted_at"]
        read_only_fields = fields


class ModuleDownSerializer(serializers.Serializer):
    module = serializers.CharField()
    backend = serializers.CharField(help_text='"" for the module\'s only backend.')
    name = serializers.CharField(help_text='"sandbox/north", or the module alone.')
    since = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField()
    waiting = serializers.CharField()


class RunLogSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunLog
        fields = ["id", "run", "kind", "detail", "at"]
        read_only_fields = fields


class CleanupQueuedSerializer(serializers.Serializer):
    run = RunSerializer()
    reset = serializers.IntegerField(help_text="Unresolved rows put back under the attempt ceiling.")
    queued = serializers.BooleanField()


class ReconcileQueuedSerializer(serializers.Serializer):
    module = serializers.CharField()
    restarted = serializers.BooleanField()
    queued = serializers.BooleanField()


class BackendReconcileQueuedSerializer(ReconcileQueuedSerializer):
    backend = serializers.CharField(help_text="The one backend whose rows are reconciled.")


class PlanLeaseSerializer(serializers.Serializer):
    baseline = serializers.JSONField(help_text="The value before the lease, to be restored.")
    applied = serializers.JSONField(help_text="The value this run applied.")
    hand_down_to = serializers.DictField(allow_null=True, help_text="The newer lease that inherits the baseline.")
    live = serializers.DictField(required=False, help_text='With ?live=1: {"value"} read now, or {"error"}.')


class PlanRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    ref = serializers.CharField()
    state = serializers.CharField()
    attempts = serializers.IntegerField()
    attempts_left = serializers.IntegerField()
    last_error = serializers.CharField()
    lease = PlanLeaseSerializer(required=False, help_text="Lease rows only.")


class PlanGroupSerializer(serializers.Serializer):
    next = serializers.CharField(
        help_text='What the next pass does: "restore", "hand down", "revert", '
        '"leave (drifted)", "waiting for a person" or "being given back now".'
    )
    verb = serializers.CharField(allow_null=True, help_text="The call that gives the group back, or null.")
    problem = serializers.CharField(allow_null=True, help_text="Why no call can, or null.")
    rows = PlanRowSerializer(many=True)


class CleanupPlanSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    next = serializers.URLField(allow_null=True, help_text="The next page of groups, null on the last.")
    previous = serializers.URLField(allow_null=True, help_text="The page before, null on the first.")
    groups = PlanGroupSerializer(many=True, help_text="This page's groups: leases, then steps' rows, then loose rows.")


class RunCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    status = serializers.DictField(child=serializers.IntegerField())
    cleanup_status = serializers.DictField(child=serializers.IntegerField())


class ResourceCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    state = serializers.DictField(child=serializers.IntegerField())
    unresolved = serializers.IntegerField()


class SummarySerializer(serializers.Serializer):
    runs = RunCountsSerializer()
    resources = ResourceCountsSerializer()
    modules_down = ModuleDownSerializer(many=True, help_text="Each backend down, by module: its work waits.")


class DetailSerializer(serializers.Serializer):
    """An error that is not about a field: 401, 403, 404, 409."""

    detail = serializers.CharField()
