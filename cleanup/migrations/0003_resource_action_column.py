"""The action that made a ledger row moves from the row's payload to its own column.

The payload then holds only what the module answered. Before, the engine added its own
``action`` to it (``setdefault``, so a module's own ``action`` field won): where the
payload's ``action`` is the engine's (the row's step says the same, or the row has no
step, or the row is the engine's own placeholder or lease), it moves; a module's field
of that name that differs from the step's action stays where the module put it.
"""

from django.db import migrations, models

ENGINE_KINDS = ("step", "override")


def move_action_out_of_payload(apps, schema_editor):
    Resource = apps.get_model("cleanup", "Resource")
    rows = Resource.objects.select_related("step").filter(payload__has_key="action")
    for row in rows.iterator(chunk_size=500):
        payload = dict(row.payload)
        kept = payload.get("action")
        step_action = row.step.action_id if row.step_id is not None else None
        engine_owned = row.kind in ENGINE_KINDS or step_action is None or kept == step_action
        row.action = step_action or (kept if isinstance(kept, str) else "")
        if engine_owned:
            payload.pop("action")
        if row.kind == "step":
            payload.pop("idempotency_key", None)  # it is the placeholder's ref
        Resource.objects.filter(pk=row.pk).update(action=row.action[:200], payload=payload)


def put_action_back_into_payload(apps, schema_editor):
    Resource = apps.get_model("cleanup", "Resource")
    for row in Resource.objects.exclude(action="").iterator(chunk_size=500):
        payload = dict(row.payload or {})
        payload.setdefault("action", row.action)
        if row.kind == "step":
            payload.setdefault("idempotency_key", row.ref)
        Resource.objects.filter(pk=row.pk).update(payload=payload)


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup", "0002_attempt"),
    ]

    operations = [
        migrations.AddField(
            model_name="resource",
            name="action",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunPython(move_action_out_of_payload, put_action_back_into_payload),
    ]
