"""The ledger's write half: what a step records before and after it acts.

The order is the point. A step writes its placeholder before it performs, so a worker
that dies mid-perform still leaves a row the sweep will give back (by the step's
idempotency key); a lease is reserved before it is applied, so a crash between the two
still restores the baseline. Each row keeps the action id in its own column because a
row outlives its step; an action row's payload is the module's, stored as it answered,
and a lease row's payload holds the engine's baseline (rule 15).
May import: the models and `registry`. Imported by the runner.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import registry
from . import rows as ledger_rows
from .models import LEASE_KIND, STEP_KIND, Resource, Step


def write_placeholder(step: Step, module: str) -> Resource:
    """The write-ahead row of one step (kind ``step``), once per step however often it runs."""
    return ledger_rows.reserve_placeholder(step, module)


def record_resources(step: Step, module: str, resources: Sequence[Mapping[str, Any]]) -> list[Resource]:
    """Ledger what a step reports it made; ``resources`` are classified entries.

    A ref the step already recorded (a retried perform reporting the same creature) is
    not recorded twice. A row is on its step's backend unless the entry names another.
    """
    if not resources:
        return []
    now = timezone.now()
    with transaction.atomic():
        known = set(Resource.objects.filter(step=step).exclude(kind=STEP_KIND).values_list("kind", "ref"))
        new: list[Resource] = []
        for item in resources:
            if (item["kind"], item["ref"]) in known:
                continue
            known.add((item["kind"], item["ref"]))
            new.append(
                Resource(
                    run_id=step.run_id,
                    step=step,
                    module=module,
                    backend=item.get("backend", step.backend),
                    kind=item["kind"],
                    ref=item["ref"],
                    member_key=item.get("member_key") or "",
                    action=step.action_id,
                    payload=dict(item.get("payload") or {}),
                    created_at=now,
                    updated_at=now,
                )
            )
        return ledger_rows.record(new)


def reserve_lease(step: Step, lease: registry.Lease, target: str, baseline: Any, applied: Any) -> Resource:
    """Record a lease (kind ``override``) before it is applied; answers the row.

    It is ``confirmed: false`` until `confirm_lease`: until then the engine does not take
    it as holding the target (rule 13).
    """
    return ledger_rows.reserve(
        run_id=step.run_id,
        step=step,
        module=lease.module,
        backend=step.backend,
        kind=LEASE_KIND,
        ref=registry.lease_ref(str(lease.id), target),
        action=step.action_id,
        payload={"baseline": baseline, "applied": applied},
    )


def confirm_lease(row: Resource) -> None:
    """The lease's apply answered success. Under a lock: a hand-down may be rewriting the
    row's baseline at the same moment, and neither change may lose the other."""
    ledger_rows.confirm(row.pk)
