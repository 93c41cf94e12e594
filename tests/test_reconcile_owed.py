"""Rule 14: a restart noticed is never forgotten. The new boot id and the reconcile it owes
are written together; the tick pays owed reconciles, a bounded number at a time, with or
without a cluster; only a reconcile that finished clears its debt, and only its own."""

import uuid
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import override_settings
from django.utils import timezone

from cleanup import outages, reconcile, registry
from cleanup.models import ModuleHealth, Resource
from cleanup.runner import tick
from cleanup.sweep import sweep
from tests.test_api_access import API, api_as
from tests.test_fleet_backends import Fleet, ended_run, rows_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    action = Fleet()
    registry.register_action(action)
    yield action
    registry.unregister_module("fleet")


def health(backend="north"):
    return ModuleHealth.objects.get(module="fleet", backend=backend)


def seen_first(fleet, backend="north"):
    """The engine has seen the backend's first boot id (no restart yet)."""
    assert outages.note_boot("fleet", backend, fleet.boot[backend]) is False
    assert health(backend).boot_id == fleet.boot[backend]


def restarted_with_rows_back(fleet, backend="north"):
    """A run given back on ``backend``, then a rollback that brought its creatures back and a
    new boot id. Answers the run."""
    run = ended_run(fleet, backend)
    sweep()
    assert fleet.worlds[backend] == set()
    seen_first(fleet, backend)
    fleet.worlds[backend] |= {r.ref for r in rows_of(run)}
    fleet.boot[backend] = fleet.boot[backend] + "-again"
    return run


def failing_on(fragment):
    """A database wrapper that fails the statement naming ``fragment``, as a lost connection would."""

    def wrapper(execute, sql, params, many, context):
        if fragment in sql:
            raise OperationalError("the connection was lost")
        return execute(sql, params, many, context)

    return wrapper


def test_the_new_boot_id_and_the_debt_it_owes_commit_together_or_not_at_all(fleet):
    seen_first(fleet)
    with connection.execute_wrapper(failing_on('"reconcile_owed_since" = COALESCE')):
        with pytest.raises(OperationalError):
            outages.note_boot("fleet", "north", "boot-n2")
    row = health()
    assert (row.boot_id, row.restarts_seen, row.reconcile_owed_since) == ("boot-n1", 0, None)

    # The next look sees the restart again, since the boot id was not kept without its debt.
    assert outages.note_boot("fleet", "north", "boot-n2") is True
    row = health()
    assert (row.boot_id, row.restarts_seen) == ("boot-n2", 1)
    assert row.reconcile_owed_since is not None


def test_the_first_boot_id_seen_owes_nothing(fleet):
    seen_first(fleet)
    assert (health().restarts_seen, health().reconcile_owed_since) == (0, None)


def test_a_restart_whose_queued_task_is_lost_is_reconciled_by_the_next_tick(fleet):
    # The queued task never runs: the test's transaction never commits, so it is never sent.
    run = restarted_with_rows_back(fleet)
    assert outages.note_boot("fleet", "north", fleet.boot["north"]) is True
    assert health().reconcile_owed_since is not None
    assert not Resource.objects.filter(run=run, resurrected_from__isnull=False).exists()

    result = tick()

    assert (result.owed.paid, result.owed.left) == (1, 0)
    assert health().reconcile_owed_since is None
    again = Resource.objects.filter(run=run, resurrected_from__isnull=False)
    assert again.count() == 2
    sweep()  # the pass queued on the reconcile is lost too; any later pass gives them back
    assert fleet.worlds["north"] == set()
    assert set(again.values_list("state", flat=True)) == {"reverted"}
    assert tick().owed.paid == 0, "a debt is paid once"


def test_a_restart_the_module_reports_is_owed_until_a_tick_pays_it(fleet):
    run = ended_run(fleet, "south")
    sweep()
    fleet.worlds["south"] |= {r.ref for r in rows_of(run)}

    registry.backend_restarted("fleet", "south")  # its queued task is lost, as above

    assert health("south").restarts_seen == 1 and health("south").reconcile_owed_since is not None
    tick()
    assert health("south").reconcile_owed_since is None
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2


def test_the_queued_task_hurries_the_reconcile_and_clears_the_debt(fleet, django_capture_on_commit_callbacks):
    run = restarted_with_rows_back(fleet)
    with django_capture_on_commit_callbacks(execute=True):
        outages.note_boot("fleet", "north", fleet.boot["north"])
    assert health().reconcile_owed_since is None
    assert fleet.worlds["north"] == set(), "the task reconciled and its pass gave them back"
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2


@pytest.mark.parametrize("how", ["raises", "no-answer"])
def test_a_reconcile_that_fails_leaves_the_debt_for_a_later_tick(fleet, monkeypatch, how):
    run = restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    if how == "raises":

        def interrupted(*args, **kwargs):  # after it asked about the live rows, before the recent reverts
            raise RuntimeError("the connection was lost")

        monkeypatch.setattr(reconcile, "_resurrect", interrupted)
    else:
        fleet.down.add("north")  # its reconcile answers `unavailable`: not knowing is not done
    start = timezone.now()
    with override_settings(EVENT_CLAIM_TIMEOUT_S=60), time_machine.travel(start, tick=False) as clock:
        first = tick()
        assert (first.owed.paid, first.owed.left) == (0, 1)
        assert health().reconcile_owed_since is not None
        assert not Resource.objects.filter(run=run, resurrected_from__isnull=False).exists()

        monkeypatch.undo()
        fleet.down.clear()
        clock.shift(timedelta(seconds=30))
        assert tick().owed.paid == 0, "its claim holds until it expires: other debts go first"
        clock.shift(timedelta(seconds=31))
        assert tick().owed.paid == 1

    assert health().reconcile_owed_since is None
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2


def test_a_restart_noticed_during_a_reconcile_is_not_cleared_by_it(fleet):
    restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    real = reconcile.reconcile_module

    def reconcile_while_it_restarts_again(*args, **kwargs):
        summary = real(*args, **kwargs)
        outages.note_boot("fleet", "north", "boot-n3")  # another worker's watch, meanwhile
        return summary

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reconcile, "reconcile_module", reconcile_while_it_restarts_again)
        first = reconcile.pay_owed()

    assert first.paid == 1
    row = health()
    assert (row.boot_id, row.restarts_seen) == ("boot-n3", 2)
    assert row.reconcile_owed_since is not None, "the newer restart is still owed"
    assert row.reconcile_claim_token is None, "and free for the next ticker at once"
    assert reconcile.pay_owed().paid == 1
    assert health().reconcile_owed_since is None


def test_two_tickers_never_pay_one_debt_at_once_and_a_dead_ones_claim_expires(fleet):
    restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    start = timezone.now()
    with override_settings(EVENT_CLAIM_TIMEOUT_S=60), time_machine.travel(start, tick=False) as clock:
        dead = outages.claim_owed(health(), token=uuid.uuid4())  # a ticker killed while paying
        assert dead is not None
        assert reconcile.pay_one(health()) is None
        assert reconcile.pay_owed().paid == 0
        assert [c for c in fleet.calls if c[0] == "reconcile"] == []
        clock.shift(timedelta(seconds=61))
        assert reconcile.pay_owed().paid == 1
    assert health().reconcile_owed_since is None


def test_a_tick_pays_at_most_the_bound_oldest_first(fleet):
    shards = ["a", "b", "c", "d", "e"]
    fleet.worlds.update({s: set() for s in shards})
    fleet.boot.update({s: f"boot-{s}1" for s in shards})
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        for shard in shards:
            ended_run(fleet, shard)
        sweep()
        for shard in reversed(shards):  # e restarted first, a last
            seen_first(fleet, shard)
            clock.shift(timedelta(seconds=1))
            assert outages.note_boot("fleet", shard, f"boot-{shard}2") is True

    def owed():
        return list(
            ModuleHealth.objects.filter(reconcile_owed_since__isnull=False)
            .order_by("backend")
            .values_list("backend", flat=True)
        )

    with override_settings(EVENT_RECONCILES_PER_TICK=2):
        first = tick()
        assert (first.owed.paid, first.owed.work_left) == (2, True)
        assert owed() == ["a", "b", "c"]
        assert tick().owed.paid == 2
        assert owed() == ["a"]
        last = tick()
        assert (last.owed.paid, last.owed.work_left) == (1, False)
    assert owed() == []
    reconciled = [c[1] for c in fleet.calls if c[0] == "reconcile"]
    assert reconciled == ["e", "d", "c", "b", "a"]


def test_a_late_reconcile_looks_back_from_the_restart_not_from_now(fleet):
    run = ended_run(fleet, "north")
    sweep()
    seen_first(fleet)
    fleet.worlds["north"] |= {r.ref for r in rows_of(run)}
    start = timezone.now()
    with (
        override_settings(EVENT_RECONCILE_LOOKBACK_S=3600),
        time_machine.travel(start + timedelta(minutes=30), tick=False) as clock,
    ):
        assert outages.note_boot("fleet", "north", "boot-n2") is True
        clock.shift(timedelta(hours=1))  # no tick for an hour: the reverts are 90 minutes old now
        assert reconcile.pay_owed().paid == 1
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2


def test_a_down_backend_keeps_its_debt_until_it_is_up(fleet):
    restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    outages.mark_down("fleet", backend="north", by="alice", reason="maintenance")
    assert reconcile.pay_owed().paid == 0
    assert reconcile.pay_one(health()) is None, "nor does the task queued for it"
    assert [c for c in fleet.calls if c[0] == "reconcile"] == []
    outages.mark_up("fleet", backend="north", by="alice")
    assert reconcile.pay_owed().paid == 1


def test_staff_see_an_owed_reconcile_on_the_module_page_and_in_the_api(fleet, client):
    from django.contrib.auth.models import User
    from django.urls import reverse

    from tests.test_api_access import API, api_as

    restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    owed_since = health().reconcile_owed_since
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))

    page = client.get(reverse("admin:cleanup_modulehealth_changelist")).content.decode()
    assert "reconcile owed" in page
    assert f"since {owed_since.astimezone().strftime('%Y-%m-%d %H:%M:%S')}" in page
    detail = client.get(reverse("admin:cleanup_modulehealth_change", args=[health().pk])).content.decode()
    assert "reconcile owed since" in detail and "after restart 1 seen" in detail

    api = api_as("view_modulehealth")

    def north():
        module = next(m for m in api.get(API + "modules/").json() if m["module"] == "fleet")
        return next(b for b in module["backends"] if b["backend"] == "north")

    assert north()["restarts_seen"] == 1 and north()["reconcile_owed_since"] is not None

    reconcile.pay_owed()
    assert 'class="reconcile-owed"' not in client.get(reverse("admin:cleanup_modulehealth_changelist")).content.decode()
    assert (north()["restarts_seen"], north()["reconcile_owed_since"]) == (1, None)


def south_owes_too(fleet):
    seen_first(fleet, "south")
    fleet.boot["south"] = "boot-s2"
    assert outages.note_boot("fleet", "south", "boot-s2") is True


def test_a_persons_reconcile_as_after_a_restart_pays_the_debts_of_the_backends_it_covers(fleet):
    run = restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    south_owes_too(fleet)
    since = health().reconcile_owed_since

    with time_machine.travel(since + timedelta(hours=1)):  # paid late: it looks back from the restart
        call_command("reconcile", "--module", "fleet", "--restarted", stdout=StringIO())

    assert health().reconcile_owed_since is None and health("south").reconcile_owed_since is None
    assert health().reconcile_claim_token is None
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2
    assert tick().owed.paid == 0, "the tick found nothing left to pay"


def test_a_plain_reconcile_leaves_the_debt_of_a_restart(fleet):
    restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    call_command("reconcile", "--module", "fleet", stdout=StringIO())
    assert health().reconcile_owed_since is not None, "a reconcile without the look-back paid a restart's debt"


def test_a_persons_reconcile_the_backend_left_unanswered_leaves_its_debt(fleet):
    restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    fleet.down.add("north")
    call_command("reconcile", "--module", "fleet", "--restarted", stdout=StringIO())
    assert health().reconcile_owed_since is not None


def test_the_apis_reconcile_of_one_backend_as_after_a_restart_pays_its_debt_alone(
    fleet, django_capture_on_commit_callbacks
):
    run = restarted_with_rows_back(fleet)
    outages.note_boot("fleet", "north", fleet.boot["north"])
    south_owes_too(fleet)
    client = api_as("cleanup_run")

    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(API + "modules/fleet/backends/north/reconcile/", {"restarted": True}, format="json")

    assert answer.status_code == 202
    assert health().reconcile_owed_since is None
    assert health("south").reconcile_owed_since is not None, "a reconcile of north paid south's debt"
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2
