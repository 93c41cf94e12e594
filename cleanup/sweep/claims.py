"""Finding a pass's work and claiming it: the first stage of a pass.

The finder names the terminal runs that still owe something; a pass takes a batch of
them (``FOR UPDATE SKIP LOCKED``, so two sweepers work different runs at once), reads
their claimable groups (a lease row, a step's rows, or one loose row, leases first), and
claims the first ``EVENT_CLEANUP_GROUPS_PER_RUN`` groups of each in one conditional
UPDATE. The claim stamps a token and an expiry, counts one attempt per row, and returns
the rows as the module calls need them, so nothing is read twice.
May import: the models, conf, `outages`, `cleanup.rows`, `statements`.
"""

from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from .. import outages, rows
from ..conf import max_revert_attempts, setting
from ..models import LEASE_KIND, Resource
from . import statements


@dataclass
class Row:
    """A claimed ledger row, as the claim returned it."""

    pk: int
    run_id: int
    step_id: int | None
    kind: str
    ref: str
    payload: dict
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
    rows: list = field(default_factory=list)

    @property
    def selector(self):
        """The group's rows, as a condition (a step's rows exclude its lease rows)."""
        if self.kind == "step":
            return Q(step_id=self.key, backend=self.backend) & ~Q(kind=LEASE_KIND)
        return Q(pk=self.key)


@dataclass
class Batch:
    """What one claim took: its token, its groups, and whether work was left behind."""

    token: object
    groups: list
    work_left: bool = False  # a run had more groups than one pass works

    @property
    def run_ids(self):
        return sorted({g.run_id for g in self.groups})

    def leases(self):
        """The lease groups, to be worked one at a time (rule 13): the newest run's first,
        and a run's leases in ledger order. Any order ends with the same value in place;
        working them one at a time is what rule 13 needs."""
        return sorted((g for g in self.groups if g.kind == "lease"), key=lambda g: (-g.run_id, g.key))

    def others(self):
        return [g for g in self.groups if g.kind != "lease"]


def runs_needing_cleanup(now, limit):
    """Ids of terminal runs in the automatic sweep that have rows to claim now, oldest first.

    Found from the rows, never from a flag (rule 2), but without reading them: a skip scan
    of ``finder_owing_run_idx`` visits each run that still owes something once, so the
    cost follows the runs with work, not the ledger's history.
    """
    sql, params = statements.finder(connection.alias, max_revert_attempts())
    return [run_id for (run_id,) in statements.fetch_prepared(sql, [*statements.bind(params, now), limit])]


def take_runs(run_ids, now, skip_locked, limit=None):
    """Lock up to ``limit`` terminal runs among ``run_ids`` that still have rows to claim,
    oldest first, for the caller's transaction.

    With ``skip_locked`` a run another sweeper is claiming right now is passed over
    rather than waited for, and the next candidate is taken instead; one whose rows a
    sweeper claimed since the finder looked is passed over too.
    """
    return statements.take_runs(run_ids, now, max_revert_attempts(), skip_locked, limit)


def pick_groups(run_ids, now, per_run, down=frozenset(), canaries=frozenset()):
    """The claimable groups of ``run_ids``, at most ``per_run`` of each run (rule 8), leases
    first. A group is a lease row, a step's other rows, or a row whose step is gone, each
    given back by one call (rule 3).

    One query that reads a row per group, not per ledger row. Answers the groups and
    whether some run had more. Groups of a backend in ``down`` (``(module, backend)``
    pairs) wait for it, but for one group of each backend in ``canaries``: the call that
    tells whether it is back. The module's other backends are worked as usual. A group
    whose sweepers died holding it more than once is claimed alone (rule 20).
    """
    heads = statements.heads(run_ids, now, max_revert_attempts())
    by_run, canaries = {}, set(canaries)
    for head in heads:
        pair = (head["module"], head["backend"])
        if pair in down:
            if pair not in canaries:
                continue
            canaries.discard(pair)
        group = _group(head)
        if head["suspect"]:
            # Its claims died with their sweepers twice: maybe its own call kills them.
            # It is worked alone, so it takes no other group's verdict down with it.
            return [group], True
        by_run.setdefault(head["run_id"], []).append(group)
    order = {"lease": 0, "step": 1, "row": 2}
    groups, work_left = [], False
    for run_groups in by_run.values():
        run_groups.sort(key=lambda g: order[g.kind])  # stable: within a kind, ledger order
        work_left = work_left or len(run_groups) > per_run
        groups.extend(run_groups[:per_run])
    return groups, work_left


def _group(head):
    where = {"backend": head["backend"], "module": head["module"]}
    if head["lease"]:
        return Group("lease", head["alone"], head["run_id"], **where)
    if head["alone"]:
        return Group("row", head["alone"], head["run_id"], **where)
    return Group("step", head["step_id"], head["run_id"], head["action_id"], head["step_key"], **where)


def claim(run_ids, token, *, skip_locked=True, limit=None, canaries=frozenset(), down=None):
    """Claim the first groups of up to ``limit`` runs among ``run_ids`` that no one else
    is claiming.

    One transaction: the runs are locked, their groups read, and every group claimed by
    one conditional UPDATE that returns the rows it took: one sweeper per row, and a token
    that fences every verdict written later (rule 9).
    """
    now = timezone.now()
    per_run = setting("EVENT_CLEANUP_GROUPS_PER_RUN")
    down = set(outages.down_backends() if down is None else down)
    with transaction.atomic():
        taken = take_runs(run_ids, now, skip_locked, limit)
        groups, work_left = pick_groups(taken, now, per_run, down, canaries) if taken else ([], False)
        claimed = _claim_rows(taken, groups, token, now) if groups else []
    for module, backend in down - set(canaries):
        # Rows of these runs that began waiting since the backend went down leave the
        # finder until its next probe.
        until = outages.waiting_until(module, now, backend=backend) or now
        outages.defer_waiting(module, until, run_ids=taken, backend=backend)
    return Batch(token, _attach(groups, claimed), work_left)


def _claim_rows(run_ids, groups, token, now):
    """Claim the groups' rows that are still claimable (`rows.claim`); answers the rows taken."""
    steps = [(g.key, g.backend) for g in groups if g.kind == "step"]
    alone = [g.key for g in groups if g.kind != "step"]
    where, where_params = statements.claim_rows(run_ids, steps, alone, now, max_revert_attempts())
    payload_field = Resource._meta.get_field("payload")
    return [
        Row(*values[:5], _json(payload_field, values[5]), *values[6:])
        for values in rows.claim(where, where_params, token, now)
    ]


def mark_called(token, groups):
    """Just before their calls: the groups' rows were called under this claim
    (`rows.mark_called`), so that a sweeper killed in a call has spent its attempt."""
    if not groups:
        return 0
    steps = [(g.key, g.backend) for g in groups if g.kind == "step"]
    alone = [g.key for g in groups if g.kind != "step"]
    return rows.mark_called(*statements.called_rows(token, steps, alone), shared=len(groups) > 1)


def _json(field_, value):
    decoded = field_.from_db_value(value, None, connection)
    return decoded if isinstance(decoded, dict) else {}


def _attach(groups, claimed):
    """Give each claimed row to its group; groups whose rows were all taken by others drop out."""
    by_key = {(g.kind, g.key, g.backend) if g.kind == "step" else (g.kind, g.key): g for g in groups}
    for row in sorted(claimed, key=lambda r: r.pk):
        if row.kind == LEASE_KIND:
            key = ("lease", row.pk)
        elif row.step_id is not None:
            key = ("step", row.step_id, row.backend)
        else:
            key = ("row", row.pk)
        if key not in by_key:  # a row its step gained since the plan was read
            by_key[key] = Group(key[0], key[1], row.run_id, backend=row.backend)
            groups.append(by_key[key])
        by_key[key].rows.append(row)
    return [g for g in groups if g.rows]
