"""One owner of the ledger row (`cleanup.rows`) and one of a run's cleanup status
(`cleanup.sweep.statuses`): read from the source, no other module writes a row's state, its
attempts or its claim, or a run's ``cleanup_status``, or restates a predicate of a row; and
each predicate answers the same in the database, in the pass's prepared SQL and for a row
already read."""

import ast
import itertools
import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from cleanup import clock, rows
from cleanup.models import Resource, ResourceState, RunStatus
from cleanup.sweep import statements, statuses
from tests.fakes import make_rows, make_run, make_step

APP = Path(__file__).resolve().parent.parent / "cleanup"
ROW_OWNER = APP / "rows.py"
STATUS_OWNER = APP / "sweep" / "statuses.py"

# A ledger row's columns only its owner writes.
ROW_FIELDS = {
    "state",
    "revert_attempts",
    "next_attempt_at",
    "retryable",
    "claim_token",
    "claim_expires_at",
    "claim_called",
    "claim_shared",
    "claim_suspect",
}
# Columns whose comparison is a predicate of the row (the claim's expiry, the attempt ceiling).
PREDICATE_FIELDS = {"claim_expires_at", "revert_attempts"}
COMPARING = {"lt", "lte", "gt", "gte"}
# Models with columns of the same names that are not the ledger's: the runner's claim on a
# run, a backend's health state.
OTHER_MODELS = {"Run", "ModuleHealth", "Step", "Wake", "Alert", "IdempotencyKey", "ModuleEvent"}
OTHER_STATES = {"ModuleState", "StepStatus", "RunStatus"}
WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}
SQL_SET = re.compile(
    r"\bSET\b[^;]*?\b(state|revert_attempts|next_attempt_at|retryable|claim_token|claim_expires_at|claim_called|claim_shared|claim_suspect|cleanup_status)\s*=",
    re.I | re.S,
)


def _root(node):
    """The name a chain of calls and attributes starts from (``Run`` of ``Run.objects.filter(...)``)."""
    while isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _called(node):
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _strings(node):
    """The text of a string constant or f-string, its holes left out."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " ? " for v in node.values)
    return None


def _other_model_names(scope):
    """The names a function binds to querysets of models other than the ledger's."""
    named = set()
    for _ in range(3):  # a name bound to another such name, a few links deep
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and _root(node.value) in OTHER_MODELS | named:
                named |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return named


def offences(source, path="<code>", *, owns_rows=False, owns_status=False):
    """Each ``(path:line, what)`` in ``source`` that writes a row's state, attempts or claim,
    or a run's cleanup status, or restates a predicate of a row."""
    tree = ast.parse(source)
    others = set()  # nodes under a chain that starts at another model
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for scope in [tree, *functions]:
        # A name bound, in one function, to a chain that starts at another model (``held =
        # Step.objects.filter(...)``) starts another model's chain too.
        named = set() if scope is tree else _other_model_names(scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and (
                _root(node) in OTHER_MODELS | named or _called(node) == "CheckConstraint"
            ):
                # A CHECK constraint bounds the column in the schema: it is no predicate of a row.
                others.update(id(n) for n in ast.walk(node))
    found = []

    def offend(node, what):
        found.append((f"{path}:{node.lineno}", what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and not owns_status:
            # A run's cleanup status is written nowhere else, whatever the chain.
            if "cleanup_status" in {k.arg for k in node.keywords} and _called(node) in WRITES:
                offend(node, f"writes a run's cleanup_status ({_called(node)})")
        if id(node) in others:
            continue
        if isinstance(node, ast.Dict) and not owns_rows:
            for key, value in zip(node.keys, node.values, strict=True):
                staged = isinstance(value, ast.Constant) and value.value is None or "ResourceState" in _names(value)
                if key is not None and _strings(key) in ROW_FIELDS and staged:
                    offend(node, f"stages a row's {_strings(key)}")
        if isinstance(node, ast.Call):
            method = _called(node)
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            for key in ("defaults", "create_defaults"):
                if isinstance(keywords.get(key), ast.Dict):
                    dict_ = keywords[key]
                    keywords.update({_strings(k): v for k, v in zip(dict_.keys, dict_.values, strict=True) if k})
            if method in WRITES or method == "Resource":
                for name, value in keywords.items():
                    if name in ROW_FIELDS and not owns_rows:
                        if name == "state" and _names(value) & OTHER_STATES:
                            continue
                        offend(node, f"writes a row's {name} ({method})")
            if not owns_rows:
                for name in keywords:
                    field, _, lookup = name.partition("__")
                    if field in PREDICATE_FIELDS and lookup in COMPARING:
                        offend(node, f"restates a predicate ({name})")
                    if field == "state" and lookup == "in" and _names(keywords[name]) & {"CLAIMABLE", "OWING"}:
                        offend(node, "restates which states the sweep claims")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                if target.attr == "cleanup_status" and not owns_status:
                    offend(node, "assigns a run's cleanup_status")
                if target.attr in ROW_FIELDS and not owns_rows and not _names(node.value) & OTHER_STATES:
                    offend(node, f"assigns a row's {target.attr}")
        elif isinstance(node, ast.Compare) and not owns_rows:
            compared = [node.left, *node.comparators]
            if any(isinstance(c, ast.Attribute) and c.attr in PREDICATE_FIELDS for c in compared):
                if any(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in node.ops):
                    offend(node, "restates a predicate (compares a claim's expiry or a row's attempts)")
        else:
            text = _strings(node)
            if text and (match := SQL_SET.search(text)):
                column = match.group(1).lower()
                if (column == "cleanup_status" and not owns_status) or (column != "cleanup_status" and not owns_rows):
                    offend(node, f"writes {column} in SQL")
    return sorted(set(found))


def engine_files():
    return [p for p in sorted(APP.rglob("*.py")) if "migrations" not in p.parts and "__pycache__" not in p.parts]


def test_no_module_but_the_owners_writes_a_rows_state_attempts_or_claim_or_a_runs_cleanup_status():
    found = []
    for path in engine_files():
        found += offences(
            path.read_text(),
            str(path.relative_to(APP.parent)),
            owns_rows=path == ROW_OWNER,
            owns_status=path == STATUS_OWNER,
        )
    assert not found, "\n".join(f"{where}: {what}" for where, what in found)


@pytest.mark.parametrize(
    "code, what",
    [
        ("Resource.objects.filter(pk=1).update(state=ResourceState.FAILED)", "writes a row's state (update)"),
        ("qs.update(revert_attempts=F('revert_attempts') - 1)", "writes a row's revert_attempts (update)"),
        ("Resource.objects.create(run=run, claim_called=True)", "writes a row's claim_called (create)"),
        ("Resource(run=run, claim_token=token)", "writes a row's claim_token (Resource)"),
        ("qs.get_or_create(pk=1, defaults={'state': 'live'})", "writes a row's state (get_or_create)"),
        ("row.claim_expires_at = None", "assigns a row's claim_expires_at"),
        ("run.cleanup_status = 'pending'", "assigns a run's cleanup_status"),
        ("qs.update(cleanup_status=CleanupStatus.PENDING)", "writes a run's cleanup_status (update)"),
        ("cursor.execute('UPDATE cleanup_resource SET state = %s WHERE id = %s')", "writes state in SQL"),
        ("sql = f'UPDATE {table} SET claim_called = true WHERE {where}'", "writes claim_called in SQL"),
        ("if row.claim_expires_at > now: pass", "restates a predicate (compares a claim's expiry or a row's attempts)"),
        (
            "ok = row.revert_attempts < max_attempts",
            "restates a predicate (compares a claim's expiry or a row's attempts)",
        ),
        ("Q(claim_expires_at__lt=now)", "restates a predicate (claim_expires_at__lt)"),
        ("qs.filter(revert_attempts__gte=3)", "restates a predicate (revert_attempts__gte)"),
        ("qs.filter(state__in=CLAIMABLE)", "restates which states the sweep claims"),
        ("values = {'state': ResourceState.FAILED, 'last_error': error}", "stages a row's state"),
        ("release = {'claim_token': None}", "stages a row's claim_token"),
        (
            "Run.objects.filter(pk=1).update(cleanup_status=CleanupStatus.PENDING)",
            "writes a run's cleanup_status (update)",
        ),
    ],
)
def test_the_reading_finds_each_kind_of_offence_and_names_its_line(code, what):
    assert offences("\n" + code, "cleanup/x.py") == [("cleanup/x.py:2", what)]


@pytest.mark.parametrize(
    "code",
    [
        "Run.objects.filter(Q(claim_expires_at__lt=now)).update(claim_token=token)",  # the runner's own claim
        "ModuleHealth.objects.filter(pk=1).update(state=ModuleState.DOWN)",
        "health.state = ModuleState.UP",
        "qs.filter(state__in=UNRESOLVED, claim_token=token)",
        "entry = {'attempts': row.revert_attempts, 'state': row.state}",
    ],
)
def test_the_reading_leaves_other_models_and_plain_reads_alone(code):
    assert offences(code) == []


def test_the_owner_stands_on_the_models_alone_and_everyone_reads_it_not_the_admin():
    """`rows` imports the models, conf, `sql` and `clock` only, so every part may ask it; `metrics`
    reads what waits for a person from it, never from the admin (a surface)."""
    from tests.test_architecture import imports_of, sources

    known = sources()
    assert imports_of("cleanup.rows", known["cleanup.rows"], known) == {
        "cleanup.models",
        "cleanup.conf",
        "cleanup.sql",
        "cleanup.clock",
    }
    metrics = imports_of("cleanup.metrics", known["cleanup.metrics"], known)
    assert "cleanup.rows" in metrics
    assert not {m for m in metrics if m.startswith(("cleanup.admin", "cleanup.api"))}
    askers = ("outages", "ledger", "wakeup", "reconcile", "manual", "plan", "admin.lists", "api.serializers")
    for name in askers:
        assert "cleanup.rows" in imports_of(f"cleanup.{name}", known[f"cleanup.{name}"], known), name


# -- each predicate, in the database and for a row in hand --------------------------------

CEILING = 3


@pytest.fixture
def every_row():
    """A row for every state x attempts x claim (none, live, run out; called or not) x
    retryable x backoff (none, passed, ahead), in a running run and in ended runs that clean
    up by themselves or are left to a person."""
    now = timezone.now()
    claims = {
        "none": {},
        "live": {"claim_token": "00000000-0000-0000-0000-000000000001", "claim_expires_at": now + timedelta(minutes=1)},
        "out": {"claim_token": "00000000-0000-0000-0000-000000000002", "claim_expires_at": now - timedelta(minutes=1)},
    }
    backoffs = {"none": None, "passed": now - timedelta(seconds=5), "ahead": now + timedelta(minutes=5)}
    made = []
    for status, auto in ((RunStatus.RUNNING, True), (RunStatus.COMPLETED, True), (RunStatus.CANCELLED, False)):
        run = make_run(status=status, auto_cleanup=auto)
        step = make_step(run)
        made += Resource.objects.bulk_create(
            Resource(
                run=run,
                step=step,
                module="test",
                kind="creature",
                ref=f"{state}-{attempts}-{claim}-{called}-{retryable}-{backoff}",
                state=state,
                revert_attempts=attempts,
                claim_called=called,
                retryable=retryable,
                next_attempt_at=backoffs[backoff],
                **claims[claim],
            )
            for state, attempts, claim, called, retryable, backoff in itertools.product(
                ResourceState.values, range(CEILING + 1), claims, [False, True], [True, False], backoffs
            )
        )
    return now, list(Resource.objects.filter(pk__in=[r.pk for r in made]).select_related("run"))


PREDICATES = {
    "claimable": lambda now: rows.claimable(now, CEILING),
    "tried again": lambda now: rows.tried_again(now, CEILING),
    "keeps its run pending": lambda now: rows.keeps_run_pending(CEILING),
    "attempts left": lambda now: rows.attempts_left(CEILING),
    "backing off": lambda now: rows.backing_off(now, CEILING),
    "awaits the sweep (waits for its backend)": lambda now: rows.awaits_sweep(CEILING),
    "a person may act": lambda now: rows.person_may_act(now),
    "claim expired": lambda now: rows.claim_expired(now),
    "spent dead claim": lambda now: rows.spent_dead_claim(now, CEILING),
    "suspect": lambda now: rows.suspect(),
    "lone suspect": lambda now: rows.lone_suspect(),
    "held past its budget": lambda now: rows.held_past_budget(now),
    "owing": lambda now: rows.owing(),
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", PREDICATES)
def test_each_predicate_answers_the_same_in_the_database_and_for_a_row_in_hand(every_row, name):
    now, made = every_row
    condition = PREDICATES[name](now)
    in_database = set(
        Resource.objects.filter(pk__in=[r.pk for r in made]).filter(condition).values_list("pk", flat=True)
    )
    in_hand = {r.pk for r in made if rows.holds(r, condition)}
    assert in_database == in_hand
    assert 0 < len(in_hand) < len(made), "a predicate that every row or none matches tells nothing"


@pytest.mark.django_db
def test_the_passes_prepared_sql_claims_exactly_the_rows_the_predicate_names(every_row):
    now, made = every_row
    where, params = statements.claimable(connection.alias, CEILING)
    assert clock.SQL in where, "the claim reads its own clock, the database's"
    table = statements.names()[0]
    found = statements.fetch_prepared(
        f"SELECT {table}.id, {clock.SQL} FROM {table} WHERE {table}.id = ANY(%s) AND {where}",
        [[r.pk for r in made], *params],
    )
    (database_now,) = {at for (_pk, at) in found}
    assert abs((database_now - now).total_seconds()) < 30, "the rows' times are set around the database's now"
    named = {r.pk for r in made if rows.holds(r, rows.claimable(None, CEILING), database_now)}
    assert {pk for (pk, _at) in found} == named


@pytest.mark.django_db
def test_a_runs_status_counts_the_rows_that_keep_it_pending(every_row):
    now, made = every_row
    counts = statements.status_counts({r.run_id for r in made}, CEILING)
    for run_id, counted in counts.items():
        mine = [r for r in made if r.run_id == run_id]
        assert counted["retryable"] == sum(rows.holds(r, rows.keeps_run_pending(CEILING)) for r in mine)


# -- the lock order ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_lock_order_is_kept_and_a_writer_that_breaks_it_is_refused():
    run = make_run(status=RunStatus.COMPLETED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    from cleanup import outages

    with transaction.atomic():  # runs, then health rows, then ledger rows
        statuses.lock_runs([run.pk])
        outages.lock_health([("test", "")])
        list(rows.lock(Resource.objects.filter(run=run)))
    with transaction.atomic():
        list(rows.lock(Resource.objects.filter(run=run)))
        with pytest.raises(rows.LockOrderBroken, match="runs locked after ledger rows"):
            statuses.lock_runs([run.pk])
    with transaction.atomic():
        outages.lock_health([("test", "")])
        with pytest.raises(rows.LockOrderBroken, match="runs locked after health rows"):
            statuses.lock_runs([run.pk])
    # A transaction that ended took its locks with it.
    with transaction.atomic():
        list(rows.lock(Resource.objects.filter(run=run)))
    with transaction.atomic():
        statuses.lock_runs([run.pk])


# -- a row being given back at the ceiling, as the admin and the API read it ----------------


@pytest.mark.django_db
def test_the_admin_and_the_api_agree_on_whether_a_row_given_back_at_the_ceiling_is_tried_again(client):
    """Rules 5, 20 and 33: a ``reverting`` row whose attempts reached the ceiling is tried again
    while its claim holds (the call under way is the sweep's), or, once the claim ran out, if
    its call never started (the takeover gives that attempt back); a dead claim whose call
    started is released as failed: it waits for a person, and the API says it is not retryable."""
    from tests.test_admin_attention import count, refs_listed, staffer
    from tests.test_api_access import api_as

    now = timezone.now()
    run = make_run(status=RunStatus.COMPLETED, name="orc raid")
    claims = {
        "orc-in-hand": {"claim_expires_at": now + timedelta(minutes=1), "claim_called": True},
        "orc-dead-before-its-call": {"claim_expires_at": now - timedelta(minutes=1), "claim_called": False},
        "orc-dead-in-its-call": {"claim_expires_at": now - timedelta(minutes=1), "claim_called": True},
    }
    made = {}
    for ref, claim in claims.items():
        (made[ref],) = make_rows(make_step(run), [ref], placeholder=False)
        Resource.objects.filter(pk=made[ref].pk).update(
            state="reverting", revert_attempts=CEILING, claim_token=uuid.uuid4(), **claim
        )
    tried_again = {"orc-in-hand", "orc-dead-before-its-call"}

    api = api_as("view_resource")
    for ref, row in made.items():
        answer = api.get(f"/api/events/resources/{row.pk}/").json()
        assert answer["retryable"] is (ref in tried_again), ref

    client.force_login(staffer())
    page = client.get("/admin/").content.decode()
    assert count(page, "count-retrying") == "2"
    assert count(page, "count-waiting") == "1"
    waiting = re.search(r'href="([^"]+)" id="count-waiting"', page)[1].replace("&amp;", "&")
    assert refs_listed(client, waiting) == {"orc-dead-in-its-call"}
    retrying = re.search(r'href="([^"]+)" id="count-retrying"', page)[1].replace("&amp;", "&")
    assert refs_listed(client, retrying) == tried_again


# -- the lease heir, as the plan names it and the pass hands down -------------------------


@pytest.mark.django_db
def test_the_plan_names_the_heir_the_pass_hands_down_to_even_within_one_run():
    """Rule 13, one choice (`rows.heir`): a run that leased one target twice hands the older
    lease's baseline down to its own newer lease, passing over an unconfirmed one, and its
    plan says so before the pass does it."""
    from cleanup import registry
    from cleanup.plan import cleanup_plan
    from cleanup.sweep import cleanup_run
    from tests.fakes import FakeLease, make_lease_row

    registry.register_lease(FakeLease())
    run = make_run(status=RunStatus.COMPLETED)
    older = make_lease_row(run, baseline=1, applied=5)
    unconfirmed = make_lease_row(run, baseline=5, applied=6)
    Resource.objects.filter(pk=unconfirmed.pk).update(payload={"baseline": 5, "applied": 6, "confirmed": False})
    newer = make_lease_row(run, baseline=6, applied=7)

    heirs = {row["id"]: row["lease"]["hand_down_to"] for group in cleanup_plan(run) for row in group["rows"]}
    assert heirs[older.pk] == {"resource": newer.pk, "run": run.pk}
    assert heirs[newer.pk] is None

    cleanup_run(run)
    older.refresh_from_db()
    newer.refresh_from_db()
    assert older.state == "reverted"
    assert newer.payload["baseline"] == 1, "the oldest baseline reached the newest lease"


@pytest.mark.django_db
def test_a_persons_waiver_and_retry_keep_the_lock_order_inside_a_callers_transaction():
    """A site may wrap each request in a transaction (``ATOMIC_REQUESTS``): a waiver and a
    retry then lock the runs before their rows, as every writer does, and write the run's
    status with its rows."""
    from cleanup import manual

    run = make_run(status=RunStatus.COMPLETED, cleanup_status="incomplete")
    orcs = make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    Resource.objects.filter(run=run).update(state="failed", revert_attempts=CEILING)
    with transaction.atomic():  # one request: a retry
        assert manual.reset_for_person(run, "alice") == 2
    with transaction.atomic():  # another: a waiver
        assert manual.waive(orcs, "gone with the old map", "alice") == 2
    run.refresh_from_db()
    assert run.cleanup_status == "complete"


VENDOR = re.compile(r"\.vendor\b|\bvendor\s*=|[\"']vendor[\"']")


def test_the_app_has_one_way_to_write_whatever_the_database():
    """The verdicts are written once, in SQL on PostgreSQL, the one database the app runs on:
    no module of the app, its migrations included, asks a connection for its vendor."""
    paths = sorted(APP.rglob("*.py"))
    assert ROW_OWNER in paths and APP / "sql.py" in paths and APP / "checks.py" in paths
    found = [
        f"{path.relative_to(APP.parent)}:{number}"
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if VENDOR.search(line)
    ]
    assert found == []


@pytest.mark.parametrize(
    "line",
    [
        'wrapper.vendor == "postgresql"',
        "if connection.vendor != 'sqlite':",
        'getattr(connection, "vendor", None)',
        "vendor = load_backend(engine).DatabaseWrapper.vendor",
    ],
)
def test_the_vendor_check_sees_a_branch_on_the_vendor(line):
    assert VENDOR.search(line)
