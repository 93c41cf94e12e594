"""Finding a pass's work and claiming it: the first stage of a pass.

The finder names the terminal runs that still owe something; a pass takes a batch of
them (``FOR UPDATE SKIP LOCKED``, so two sweepers work different runs at once), reads
their claimable groups (a lease row, a step's rows, or one loose row, leases first), and
claims the first ``EVENT_CLEANUP_GROUPS_PER_RUN`` groups of each in one conditional
UPDATE. The claim stamps a token and an expiry, counts one attempt per row, and returns
the rows as the module calls need them, so nothing is read twice.
May import: the models, conf, `clock`, `outages`, `cleanup.rows`, `statements`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Q

from .. import clock, outages, rows
from ..conf import claim_timeout_s, max_revert_attempts, setting
from ..models import LEASE_KIND
from ..sql import fetch_prepared
from . import statements

# A module and one of its backends.
Pair = tuple[str, str]


@dataclass
class Row:
    """A claimed ledger row, as the claim returned it."""

    pk: int
    run_id: int
    step_id: int | None
    kind: str
    ref: str
    payload: dict[str, Any]
    member_key: str
    revert_attempts: int
    action: str  # the action that made the row, kept on the row as it outlives its step
    backend: str = ""  # which of its module's backends holds it


@dataclass
class Group:
    """Rows given back by one call: a lease row, a step's rows on one backend, or one loose row."""

    kind: str  # "lease", "step" or "row"
    key: int  # the lease row's id, the step's id, or the loose row's id
    run_id: int
    action_id: str | None = None  # the step's action, for a step's group
    step_key: str | None = None  # the step's idempotency key
    backend: str = ""  # the backend that holds the group's rows
    module: str | None = None
    rows: list[Row] = field(default_factory=list)

    @property
    def selector(self) -> Q:
        """The group's rows, as a condition (a step's rows exclude its lease rows)."""
        if self.kind == "step":
            return Q(step_id=self.key, backend=self.backend) & ~Q(kind=LEASE_KIND)
        return Q(pk=self.key)


@dataclass
class Batch:
    """What one claim took: its token, its groups, and whether work was left behind."""

    token: uuid.UUID
    groups: list[Group]
    work_left: bool = False  # a run had more groups than one pass works
    # The claim marked its groups called together (`rows.claiming`): no wave is marked again.
    called_together: bool = False
    # When the claim runs out, on this process's monotonic clock, less a margin: a write
    # that lost its database is tried again until then (`reconnect`).
    held_until: float = field(default_factory=lambda: time.monotonic() + claim_timeout_s())

    @property
    def run_ids(self) -> list[int]:
        return sorted({g.run_id for g in self.groups})

    def leases(self) -> list[Group]:
        """The lease groups, to be worked one at a time (rule 13): the newest run's first,
        and a run's leases in ledger order. Any order ends with the same value in place;
        working them one at a time is what rule 13 needs."""
        return sorted((g for g in self.groups if g.kind == "lease"), key=lambda g: (-g.run_id, g.key))

    def others(self) -> list[Group]:
        return [g for g in self.groups if g.kind != "lease"]


def runs_needing_cleanup(limit: int) -> list[int]:
    """Ids of terminal runs in the automatic sweep that have rows to claim now, oldest first.

    Found from the rows, never from a flag (rule 2), but without reading them: a skip scan
    of ``finder_owing_run_idx`` visits each run that still owes something once, so the
    cost follows the runs with work, not the ledger's history.
    """
    sql, params = statements.finder(connection.alias, max_revert_attempts())
    return [run_id for (run_id,) in fetch_prepared(sql, [*params, limit])]


def look(limit: int) -> tuple[list[int], bool, bool]:
    """What a pass reads before its work, in one query (`statements.look`): the runs the
    finder names now (`runs_needing_cleanup`), whether a dead claim waits to be released
    (rule 20), and whether a backend is down or being blamed (`outages.Snapshot`)."""
    return statements.look(limit, max_revert_attempts())


def claim(
    run_ids: Sequence[int],
    token: uuid.UUID,
    *,
    skip_locked: bool = True,
    limit: int | None = None,
    canaries: Collection[Pair] = frozenset(),
    down: Collection[Pair] | None = None,
) -> Batch:
    """Claim the first groups of up to ``limit`` runs among ``run_ids`` that no one else
    is claiming.

    One statement, its own transaction (`statements.claim`): the runs are locked, their
    groups read and chosen, and every chosen group claimed by
    one conditional UPDATE that returns the rows it took: one sweeper per row, and a token
    that fences every verdict written later (rule 9).
    """
    down = set(outages.down_backends() if down is None else down)
    # Read before the claim is sent: its expiry, on the database's clock, starts later.
    held_until = time.monotonic() + claim_timeout_s() - max(0.5, claim_timeout_s() / 10)
    answer = statements.claim(
        run_ids,
        token,
        max_revert_attempts(),
        skip_locked=skip_locked,
        limit=limit,
        per_run=setting("EVENT_CLEANUP_GROUPS_PER_RUN"),
        down=down,
        canaries=set(canaries) & down,
    )
    outcome = next(values for values in answer if values[0] is None and values[_AT["group_kind"]] is None)
    taken = sorted(outcome[_AT["taken"]] or [])
    work_left = bool(outcome[_AT["work_left"]])
    kind_at, key_at, action_at, step_key_at, module_at, nth_at = (
        _AT[c] for c in ("group_kind", "group_key", "action_id", "step_key", "module", "nth")
    )
    heads = sorted(
        (values for values in answer if values[0] is None and values[kind_at] is not None),
        key=lambda values: (values[_AT["run_id"]], values[nth_at]),
    )
    groups: dict[tuple[str, int, str], Group] = {}
    for values in heads:
        kind, key, backend = values[kind_at], values[key_at], values[_AT["backend"]]
        step = kind == "step"
        groups.setdefault(
            (kind, key, backend if step else ""),
            Group(
                kind,
                key,
                values[_AT["run_id"]],
                values[action_at] if step else None,
                values[step_key_at] if step else None,
                backend=backend,
                module=values[module_at],
            ),
        )
    claimed = sorted((values for values in answer if values[0] is not None), key=lambda values: values[0])
    for values in claimed:
        row = Row(*values[:5], _json(values[5]), *values[6:_ROW_END])  # type: ignore[call-arg]
        if row.kind == LEASE_KIND:
            found = groups.get(("lease", row.pk, ""))
        elif row.step_id is not None:
            found = groups.get(("step", row.step_id, row.backend))
        else:
            found = groups.get(("row", row.pk, ""))
        if found is not None:  # the claim takes only the chosen groups' rows
            found.rows.append(row)
    chosen = [g for g in groups.values() if g.rows]
    for module, backend in down - set(canaries):
        # Rows of these runs that began waiting since the backend went down leave the
        # finder until its next probe.
        until = outages.waiting_until(module, backend=backend)
        outages.defer_waiting(module, until or clock.now(), run_ids=taken, backend=backend)
    together = bool(chosen) and bool(outcome[_AT["together"]])
    return Batch(token, chosen, work_left, called_together=together, held_until=held_until)


# Where the claim's answer has each of its columns (`statements.CLAIM_COLUMNS`); a row's
# own columns come first, in the order of `Row`'s fields (`rows.CLAIMED_COLUMNS`).
_AT = {name: i for i, name in enumerate(statements.CLAIM_COLUMNS)}
_ROW_END = len(rows.CLAIMED_COLUMNS)


def mark_called(token: uuid.UUID, groups: Sequence[Group]) -> int:
    """Just before their calls: the groups' rows were called under this claim
    (`rows.mark_called`), so that a sweeper killed in a call has spent its attempt."""
    if not groups:
        return 0
    steps = [(g.key, g.backend) for g in groups if g.kind == "step"]
    singles = [g.key for g in groups if g.kind != "step"]
    where, params = statements.called_rows(token, steps, singles)
    return rows.mark_called(where, params, shared=len(groups) > 1)


def _json(value: Any) -> dict[str, Any]:
    """A row's payload as the claim returned it (JSON text): a dict, or an empty one."""
    decoded = json.loads(value) if isinstance(value, str | bytes) else value
    return decoded if isinstance(decoded, dict) else {}
