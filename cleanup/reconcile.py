"""Reconcile: asking a module which of its ledgered resources the world still has.

A resource the module no longer has becomes ``orphaned``, never ``reverted``: nobody gave
it back, it vanished while nobody was looking, and a person reading the ledger must be
able to tell the two apart. Anything short of a clear answer (a timeout, an exception,
a malformed envelope, no ``reconcile`` at all) leaves the ledger alone, because "I do
not know" must never read as "it is gone" (rule 10).

After a backend restart (rule 14), reconcile also asks about what was given back within
``EVENT_RECONCILE_LOOKBACK_S``: a shard that rolled back to its last save may have
brought some of it back, and each such resource is ledgered anew and given back again.
A restart noticed is a debt on the backend's health row (`cleanup.outages.owe_reconcile`):
`pay_owed`, at every tick, reconciles the backends that owe one, a bounded number at a time,
and clears each debt only once its reconcile finished with an answer from the backend. A
reconcile a person asks for as after a restart (`manage.py reconcile --restarted`, the API's
``restarted``) goes through `reconcile`, which pays the debts of the backends it covers the
same way (`_pay`): one path for the tick's reconcile and a person's.
Its first contact with a backend that keeps a dead-man's switch is a renewal (`deadman`,
rule 34), so that what the switch gave back by itself is recorded as given back, not gone.
May import: the models, conf, `clock`, `calls`, `registry`, `cleanup.rows`, `outages`, `enqueue`, `deadman`, the pass's
`leases` (rule 13) and `statuses`; never a surface.
"""

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from . import calls, clock, deadman, outages, registry, rows
from .conf import setting
from .enqueue import queue_sweep
from .models import (
    LEASE_KIND,
    STEP_KIND,
    UNRESOLVED,
    LogKind,
    ModuleHealth,
    Resource,
    ResourceState,
    RunLog,
)
from .sweep import leases, statuses

logger = logging.getLogger(__name__)


class UnknownModule(LookupError):
    pass


@dataclass
class ReconcileSummary:
    asked: int = 0
    in_force: int = 0
    orphaned: int = 0
    unanswered: int = 0
    resurrected: int = 0
    forgotten: int = 0  # leases the backend no longer held, settled as orphaned
    unreachable: int = 0  # questions whose answer blamed the backend (no answer in time, unreachable)

    def line(self, name: str) -> str:
        return (
            f"reconciled {name}: asked {self.asked}, in force {self.in_force}, "
            f"orphaned {self.orphaned}, unanswered {self.unanswered}, "
            f"resurrected {self.resurrected}"
        )


Group = list[Resource]


def _groups(rows: Iterable[Resource]) -> list[Group]:
    """Rows by the step that made them and the backend that holds them (a row without a
    step alone), placeholders skipped."""
    groups: dict[tuple[Any, ...], Group] = {}
    for row in rows:
        if row.kind == STEP_KIND:
            continue
        key = ("step", row.step_id, row.backend) if row.step_id is not None else ("row", row.pk)
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def _ask(group: Group, summary: ReconcileSummary | None = None) -> tuple[calls.Reply | None, str]:
    """The module's `calls.Reply` about ``group`` (its ``value``: the refs in force, its
    ``unknown``: those it cannot tell about), or None when it gave no clear answer; an
    answer that blames the backend is counted in ``summary.unreachable``."""
    action_id = group[0].action_id or ""
    action = registry.get_action(action_id) if action_id else None
    # Optional (`registry.ACTION_OPTIONAL`): an action without one gives no answer.
    ask = getattr(action, "reconcile", None)
    if action is None or not callable(ask):
        return None, action_id
    answer = calls.call(
        ask,
        budget_ms=calls.budget_of(action),
        what=action_id,
        backend=group[0].backend,
        verb="reconcile",
        module=action.module,
        run_id=group[0].run_id,
        resources=[{"kind": r.kind, "ref": r.ref, "payload": r.payload, "member_key": r.member_key} for r in group],
    )
    reply = calls.classify_reconcile(answer, action_id)
    _count_blame(answer, summary)
    if not reply.ok:
        logger.warning("reconcile of %s left the ledger alone: %s", action_id, reply.error)
        return None, action_id
    return reply, action_id


def _count_blame(answer: calls.Answer, summary: ReconcileSummary | None) -> None:
    if summary is not None and outages.blame(answer) is not None:
        summary.unreachable += 1


def module_known(name: str) -> bool:
    """A registered module, or an uninstalled one that still owns ledger rows."""
    if name in registry.modules():
        return True
    return "\x00" not in name and Resource.objects.filter(module=name).exists()


def reconcile_module(
    name: str, restarted: bool = False, backend: str | None = None, restarted_at: datetime | None = None
) -> ReconcileSummary:
    """Reconcile one module's live rows, and after a restart its recent reverts and its
    leases too; ``backend`` (a name, ``""`` included) limits it to that backend's rows.
    ``restarted_at``, when the restart was noticed, is where the look-back starts (now by
    default): a reconcile paid late still asks about what was given back before the restart."""
    if not module_known(name):
        raise UnknownModule(f'no module is named "{name}"')
    deadman.renew_module(name, backend)
    summary = ReconcileSummary()
    mine = Q(module=name) if backend is None else Q(module=name, backend=backend)
    live = (
        Resource.objects.filter(mine, state=ResourceState.LIVE)
        .exclude(kind__in=(STEP_KIND, LEASE_KIND))
        .select_related("step")
        .order_by("id")
    )
    for group in _groups(live):
        reply, action_id = _ask(group, summary)
        if reply is None:
            summary.unanswered += len(group)
            continue
        # Refs the module cannot tell about are left as they are: not knowing is not gone.
        known = [r for r in group if r.ref not in reply.unknown]
        summary.unanswered += len(group) - len(known)
        summary.asked += len(known)
        in_force = _refs(reply.value)
        gone = [r for r in known if r.ref not in in_force]
        summary.in_force += len(known) - len(gone)
        summary.orphaned += _orphan(name, action_id, gone)
    if restarted:
        summary.orphaned += _failed_gone(name, mine, summary)
        summary.forgotten = _forgotten_leases(name, mine, summary)
        summary.resurrected = _resurrect(name, mine, restarted_at, summary)
    return summary


def _failed_gone(name: str, mine: Q, summary: ReconcileSummary) -> int:
    """After a restart, the backend's ``failed`` rows are asked about like live ones: what the
    restart took away is ``orphaned``, what is still there stays ``failed``."""
    failed = (
        Resource.objects.filter(mine, state=ResourceState.FAILED)
        .exclude(kind__in=(STEP_KIND, LEASE_KIND))
        .select_related("step")
        .order_by("id")
    )
    count = 0
    for group in _groups(failed):
        reply, action_id = _ask(group, summary)
        if reply is None:
            summary.unanswered += len(group)
            continue
        gone = [r for r in group if r.ref not in reply.unknown and r.ref not in _refs(reply.value)]
        summary.asked += len(group) - sum(r.ref in reply.unknown for r in group)
        orphaned = rows.orphan_failed(
            Resource.objects.filter(pk__in=[r.pk for r in gone]),
            "the backend restarted and this is no longer in the world",
            module=name,
            action=action_id,
        )
        count += len(orphaned)
    return count


def _refs(value: object) -> frozenset[object]:
    """The refs a classified reconcile answered in force (`calls.classify_reconcile`: a frozenset)."""
    return value if isinstance(value, frozenset) else frozenset()


def _orphan(name: str, action_id: str, gone: Sequence[Resource]) -> int:
    """Mark the rows that are still live ``orphaned``, and log each; answers how many.

    A row the sweep claimed meanwhile is not live any more and is not orphaned.
    """
    orphaned = rows.orphan(
        Resource.objects.filter(pk__in=[r.pk for r in gone]),
        "the module reports this is no longer in the world",
        module=name,
        action=action_id,
    )
    return len(orphaned)


def _recent_reverts(mine: Q, since: datetime) -> QuerySet[Resource]:
    return Resource.objects.filter(
        mine, state=ResourceState.REVERTED, resolved_at__gte=since, resurrection__isnull=True
    ).select_related("step")


def _resurrect(
    name: str, mine: Q, restarted_at: datetime | None = None, summary: ReconcileSummary | None = None
) -> int:
    """Rule 14: record again what a rolled-back backend brought back, to give it back."""
    since = (restarted_at or clock.now()) - timedelta(seconds=setting("EVENT_RECONCILE_LOOKBACK_S"))
    back: list[tuple[Resource, str]] = []  # (row, what)
    recent = _recent_reverts(mine, since).exclude(kind__in=(STEP_KIND, LEASE_KIND)).order_by("id")
    for group in _groups(recent):
        reply, action_id = _ask(group, summary)
        if reply is not None:
            in_force = _refs(reply.value)
            back.extend((row, action_id) for row in group if row.ref in in_force)
    back.extend(_leases_back(_recent_reverts(mine, since).filter(kind=LEASE_KIND).order_by("-id"), summary))
    count = 0
    touched_runs: set[int] = set()
    for row, what in back:
        try:
            with transaction.atomic():
                again = rows.resurrect(row)
                RunLog.write(
                    row.run_id,
                    LogKind.RESOURCE_RESURRECTED,
                    module=name,
                    action=what,
                    resource=f"{row.kind}:{row.ref}",
                    resource_id=again.pk,
                    previous_id=row.pk,
                )
        except IntegrityError:
            continue  # another reconcile recorded it first
        count += 1
        touched_runs.add(row.run_id)
    if touched_runs:
        statuses.reopen(touched_runs, clock.now())
    return count


def _leases_back(rows: QuerySet[Resource], summary: ReconcileSummary | None = None) -> list[tuple[Resource, str]]:
    """Restored leases whose applied value is in force again: a save taken while they held.

    One read per target, and only the newest restored lease of a target counts: it is the
    one whose restore the rollback undid. A target that an unresolved lease holds now is
    that lease's business, not a resurrection.
    """
    seen: set[str] = set()
    back: list[tuple[Resource, str]] = []
    for row in rows:
        if row.ref in seen:
            continue
        seen.add(row.ref)
        lease, target = registry.lease_for_ref(row.ref)
        payload = row.payload if isinstance(row.payload, dict) else {}
        if lease is None or "applied" not in payload:
            continue
        if registry.same_value(lease, payload["applied"], payload.get("baseline")):
            continue
        if Resource.objects.filter(kind=LEASE_KIND, ref=row.ref, backend=row.backend, state__in=UNRESOLVED).exists():
            continue
        reply = _read(lease, target, row.backend, summary)
        if reply.ok and registry.same_value(lease, reply.value, payload["applied"]):
            back.append((row, row.ref))
    return back


def _read(lease: registry.Lease, target: str, backend: str, summary: ReconcileSummary | None = None) -> calls.Reply:
    """The value in force on a lease's target, as a `calls.Reply`."""
    what = f"{lease.id}.read"
    answer = calls.call(lease.read, budget_ms=calls.budget_of(lease), what=what, backend=backend, target=target)
    _count_blame(answer, summary)
    return calls.classify_reply(answer, what, key="value")


FORGOTTEN = "the backend no longer holds this override"


def _forgotten_leases(name: str, mine: Q, summary: ReconcileSummary | None = None) -> int:
    """After a restart: the module's open leases whose override the backend no longer holds.

    A setting kept in memory is back at its configured value after a crash, while the
    ledger still holds the lease. Each target is read once; its open leases are looked at
    oldest first, and one whose baseline is in force again (and not its own applied value)
    is ``orphaned`` with the reason, logged, and hands its baseline down to the next newer
    lease on the target (rule 13), so the stack still restores the first baseline. A row a
    sweeper holds is left to its verdict; a read without a clear answer changes nothing.
    Answers how many leases were settled.
    """
    targets = list(
        Resource.objects.filter(mine, kind=LEASE_KIND, state__in=rows.SWEPT_STATES)
        .order_by("id")
        .values_list("ref", "backend")
        .distinct()
    )
    settled = 0
    for ref, backend in dict.fromkeys(targets):
        lease, target = registry.lease_for_ref(ref)
        if lease is None:
            continue
        reply = _read(lease, target, backend, summary)
        if reply.ok:
            settled += int(leases.settle_forgotten(ref, backend, reply.value, FORGOTTEN))
    return settled


def reconcile(name: str, restarted: bool = False, backend: str | None = None) -> ReconcileSummary:
    """The reconcile a person asks for (`manage.py reconcile`, the API's queued task) of one
    module, or of one of its backends. As after a restart (``restarted``), it is the owed
    reconcile of each backend it covers that owes one (`outages.owed`): it claims their
    debts, looks back from the oldest, and clears them once it finished with an answer from
    the backend (`_pay`), as the tick would have; a backend another worker is paying keeps
    its debt for that worker."""
    if not restarted:
        return reconcile_module(name, backend=backend)
    if not module_known(name):
        raise UnknownModule(f'no module is named "{name}"')
    token = uuid.uuid4()
    debts = [
        claimed
        for health in outages.owed(module=name, backend=backend)
        if (claimed := outages.claim_owed(health, token))
    ]
    return _pay(name, backend, debts, token)


def _pay(name: str, backend: str | None, debts: Sequence[ModuleHealth], token: uuid.UUID) -> ReconcileSummary:
    """Reconcile ``name`` (``backend`` alone, or every backend) as after a restart, looking
    back from the oldest of ``debts`` (the owed reconciles ``token`` claimed), and clear each
    debt once it finished with every answer from the backend. One that raised leaves the
    debts and raises; one the backend left unanswered (`_count_blame`) leaves them: their
    claims are left to expire, so the next tries come after ``EVENT_CLAIM_TIMEOUT_S``."""
    since = min((debt.reconcile_owed_since for debt in debts if debt.reconcile_owed_since), default=None)
    summary = reconcile_module(name, restarted=True, backend=backend, restarted_at=since)
    if summary.unreachable:
        logger.warning(
            "the reconcile of %s had no answer from the backend %d time(s); %d owed reconcile(s) stay owed",
            name,
            summary.unreachable,
            len(debts),
        )
    else:
        for debt in debts:
            outages.clear_owed(debt, token)
    if summary.resurrected:
        queue_sweep()
    return summary


def reconcile_all(restarted: bool = False) -> dict[str, ReconcileSummary]:
    """Reconcile every module that owns a live row: what a worker does when it starts. As
    after a restart, the modules that owe a reconcile too (`reconcile`)."""
    names = set(
        Resource.objects.filter(state=ResourceState.LIVE).exclude(kind=STEP_KIND).values_list("module", flat=True)
    )
    if restarted:
        names |= set(outages.owed().values_list("module", flat=True))
    results = {}
    for name in sorted(names):
        try:
            results[name] = reconcile(name, restarted=restarted)
        except Exception:
            logger.exception("reconcile of module %s failed", name)
    return results


@dataclass
class OwedResult:
    paid: int = 0  # debts cleared: their reconcile finished
    left: int = 0  # reconciles that failed or had no answer from the backend: owed still
    work_left: bool = False  # stopped at the bound or the deadline with debts still owed


def pay_owed(limit: int | None = None, deadline: datetime | None = None, now: datetime | None = None) -> OwedResult:
    """Reconcile the backends that owe one after a restart (rule 14), oldest debt first, at
    most ``limit`` of them (``EVENT_RECONCILES_PER_TICK``); what the tick does, whether or
    not a cluster runs. None is started past ``deadline``."""
    if limit is None:
        limit = int(setting("EVENT_RECONCILES_PER_TICK"))
    result = OwedResult()
    for health in list(outages.owed(now)[: limit + 1]):
        if result.paid + result.left >= limit or _past(deadline):
            result.work_left = True
            break
        paid = pay_one(health)
        if paid is True:
            result.paid += 1
        elif paid is False:
            result.left += 1
    return result


def _past(deadline: datetime | None) -> bool:
    return deadline is not None and timezone.now() >= deadline


def pay_one(health: ModuleHealth) -> bool | None:
    """Claim and pay one backend's owed reconcile: True when it finished and its debt was
    cleared (or a newer one stays), False when it failed, None when another holds the claim.

    A reconcile that raised, or whose backend gave no answer to a question (`_count_blame`),
    leaves the debt; its claim is left to expire, so the next tries come after
    ``EVENT_CLAIM_TIMEOUT_S`` and other debts go first meanwhile. One killed midway leaves
    its claim the same way.
    """
    token = uuid.uuid4()
    claimed = outages.claim_owed(health, token)
    if claimed is None:
        return None
    if not module_known(claimed.module):
        # Nothing is ledgered for it, and nothing can be brought back.
        outages.clear_owed(claimed, token)
        return True
    try:
        summary = _pay(claimed.module, claimed.backend, [claimed], token)
    except Exception:
        logger.exception("the owed reconcile of %s failed; a later tick tries again", claimed.name)
        return False
    if summary.unreachable:
        return False
    logger.info(summary.line(claimed.name))
    return True
