"""Ledgers of ended runs for the reliability scenarios, written in a few bulk statements."""

import uuid

from cleanup import registry
from cleanup.models import LEASE_KIND, Resource, Run, RunStatus, Step


def ended_runs(runs, steps, rows, prefix="orc", status=RunStatus.COMPLETED, attempts=0):
    """``runs`` ended runs of ``steps`` `rel.spawn` steps with ``rows`` rows each; answers the runs."""
    made = Run.objects.bulk_create(Run(name=f"raid {i}", status=status, cleanup_status="pending") for i in range(runs))
    made_steps = Step.objects.bulk_create(
        Step(
            run=run,
            position=p,
            action_id="rel.spawn",
            idempotency_key=f"k{uuid.uuid4().hex[:16]}",
            status="done",
            params={"count": rows},
        )
        for run in made
        for p in range(steps)
    )
    Resource.objects.bulk_create(
        Resource(
            run_id=step.run_id,
            step=step,
            module="rel",
            kind="creature",
            ref=f"{prefix}-{step.idempotency_key}-{i}",
            action="rel.spawn",
            revert_attempts=attempts,
        )
        for step in made_steps
        for i in range(rows)
    )
    return made


def run_of_steps(prefixes, rows=1, status=RunStatus.COMPLETED, attempts=0):
    """One ended run with a `rel.spawn` step per prefix; its rows' refs start with that prefix."""
    run = Run.objects.create(name="poisoned raid", status=status, cleanup_status="pending")
    for position, prefix in enumerate(prefixes):
        step = Step.objects.create(
            run=run,
            position=position,
            action_id="rel.spawn",
            idempotency_key=f"k{uuid.uuid4().hex[:16]}",
            status="done",
        )
        Resource.objects.bulk_create(
            Resource(
                run=run,
                step=step,
                module="rel",
                kind="creature",
                ref=f"{prefix}-{step.idempotency_key}-{i}",
                action="rel.spawn",
                revert_attempts=attempts,
            )
            for i in range(rows)
        )
    return run


def lease_row(run, target, baseline, applied):
    return Resource.objects.create(
        run=run,
        module="rel",
        kind=LEASE_KIND,
        ref=registry.lease_ref("rel.rate", target),
        action="core.lease",
        payload={"baseline": baseline, "applied": applied},
    )
