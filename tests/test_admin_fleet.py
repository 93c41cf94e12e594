"""The admin of a fleet: one module, two backends (north and south), each with its own health.

What waits shows its own backend's outage; the ledger, the run page, the steps and the
modules' log show and filter by backend; module health lists every backend, and a person
marks one down or up on its own. A site whose modules have one backend each shows none of it.
"""

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup import outages, registry
from cleanup.models import Resource, RunStatus, Step
from tests.fakes import FakeAction, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

LEDGER = reverse("admin:cleanup_resource_changelist")
HEALTH = reverse("admin:cleanup_modulehealth_changelist")


@pytest.fixture
def module():
    registry.register_action(FakeAction())
    return "test"


def on(backend, step, refs):
    """A step of ``backend`` and its rows (no placeholder)."""
    Step.objects.filter(pk=step.pk).update(backend=backend)
    step.backend = backend
    rows = make_rows(step, refs, placeholder=False)
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(backend=backend)
    return rows


@pytest.fixture
def fleet(module):
    """An ended run with rows on north and south, a running run with a pending step on each."""
    ended = make_run(status=RunStatus.ABORTED, name="orc raid", cleanup_status="pending")
    on("north", make_step(ended), ["orc-n1", "orc-n2"])
    on("south", make_step(ended), ["orc-s1", "orc-s2", "orc-s3"])
    running = make_run(status=RunStatus.RUNNING, name="festival")
    on("north", make_step(running, status="pending"), [])
    on("south", make_step(running, status="pending"), [])
    return {"ended": ended, "running": running}


@pytest.fixture
def staffer(client):
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    return client


def listed(client, url):
    page = client.get(url)
    assert page.status_code == 200, page.content[:500]
    return {getattr(r, "ref", None) or r.pk for r in page.context["cl"].result_list}


# -- what waits, waits on its own backend --------------------------------------------------


def test_marking_north_down_holds_only_norths_rows_and_steps(staffer, fleet):
    assert outages.mark_down("test", backend="north", by="alice", reason="shard deploy")
    assert outages.down_backends() == {("test", "north")}

    page = staffer.get(LEDGER).content.decode()
    assert page.count("waiting: test/north is down since") == 2
    assert "waiting: test is down" not in page and "test/south" not in page

    run_page = staffer.get(reverse("admin:cleanup_run_change", args=[fleet["ended"].pk])).content.decode()
    assert run_page.count("waiting: test/north is down since") == 2
    steps_page = staffer.get(reverse("admin:cleanup_run_change", args=[fleet["running"].pk])).content.decode()
    assert steps_page.count("waiting: test/north is down since") == 1, "only north's step waits"

    north_row = Resource.objects.get(ref="orc-n1")
    row_page = staffer.get(reverse("admin:cleanup_resource_change", args=[north_row.pk])).content.decode()
    assert "waiting: test/north is down since" in row_page
    south_row = Resource.objects.get(ref="orc-s1")
    assert "waiting:" not in staffer.get(reverse("admin:cleanup_resource_change", args=[south_row.pk])).content.decode()


def test_the_module_marked_down_as_a_whole_holds_only_its_backend_of_its_own(staffer, fleet):
    outages.mark_down("test", by="alice", reason="deploy")
    assert outages.down_backends() == {("test", "")}
    assert "waiting:" not in staffer.get(LEDGER).content.decode(), "north and south rows do not wait on test's ''"


def test_the_waiting_text_is_read_once_per_page_whatever_its_backends(staffer, fleet):
    outages.mark_down("test", backend="north", by="alice", reason="deploy")
    with CaptureQueriesContext(connection) as few:
        staffer.get(LEDGER)
    for name in ("east", "west", "up-north"):
        on(name, make_step(fleet["ended"]), [f"wolf-{name}-{i}" for i in range(5)])
    with CaptureQueriesContext(connection) as many:
        staffer.get(LEDGER)
    assert len(many) == len(few), "the waiting text is read per row or per backend"


# -- the ledger, the steps and a run's page show and filter by backend ----------------------


def headers(page):
    return re.findall(r'<th scope="col" class="[^"]*column-(\w+)', page)


def test_the_ledger_shows_each_rows_backend_and_filters_by_it(staffer, fleet):
    page = staffer.get(LEDGER).content.decode()
    assert headers(page)[:3] == ["ref_short", "state", "backend_shown"]
    assert re.search(r'<td class="field-backend_shown">north</td>', page)
    assert listed(staffer, LEDGER + "?backend=north") == {"orc-n1", "orc-n2"}
    assert listed(staffer, LEDGER + "?backend=south&module=test") == {"orc-s1", "orc-s2", "orc-s3"}
    assert listed(staffer, LEDGER + "?backend=nowhere") == set(), "an unknown backend lists nothing, not an error"
    choices = re.findall(r'href="\?backend=(\w+)"', page)
    assert choices == ["north", "south"]

    row = Resource.objects.get(ref="orc-n1")
    detail = staffer.get(reverse("admin:cleanup_resource_change", args=[row.pk])).content.decode()
    assert re.search(r'field-backend_shown.*?<div class="readonly">north</div>', detail, re.S)


def test_the_backend_filter_never_distincts_the_whole_ledger(staffer, fleet):
    with CaptureQueriesContext(connection) as captured:
        listed(staffer, LEDGER)
        listed(staffer, LEDGER + "?backend=north")
        listed(staffer, reverse("admin:cleanup_step_changelist") + "?backend=north")
    for sql in (c["sql"].upper() for c in captured.captured_queries if "cleanup_resource" in c["sql"]):
        if "DISTINCT" in sql:
            assert "STATE" in sql and "IN (" in sql and "LIMIT" in sql, f"a DISTINCT over the whole ledger: {sql}"


def test_a_backend_known_only_from_its_health_row_is_a_choice(staffer, module):
    outages.mark_down("test", backend="east", by="alice", reason="deploy")
    page = staffer.get(LEDGER).content.decode()
    assert re.findall(r'href="\?backend=(\w+)"', page) == ["east"]


def test_the_steps_show_and_filter_by_backend(staffer, fleet):
    steps = reverse("admin:cleanup_step_changelist")
    page = staffer.get(steps).content.decode()
    assert headers(page)[:3] == ["position", "action_id", "backend_shown"]
    north = listed(staffer, steps + "?backend=north")
    assert north == set(Step.objects.filter(backend="north").values_list("pk", flat=True)) and len(north) == 2
    step = Step.objects.filter(backend="south").first()
    detail = staffer.get(reverse("admin:cleanup_step_change", args=[step.pk])).content.decode()
    assert re.search(r'field-backend_shown.*?<div class="readonly">south</div>', detail, re.S)


def test_a_runs_page_shows_the_backend_of_its_rows_and_steps_and_links_each(staffer, fleet):
    page = staffer.get(reverse("admin:cleanup_run_change", args=[fleet["ended"].pk])).content.decode()
    rows = page.split('id="rows"')[1].split('id="plan"')[0]
    assert "<th>backend</th>" in rows and rows.count('<td class="backend">north</td>') == 2
    assert rows.count('<td class="backend">south</td>') == 3
    links = dict(re.findall(r'<a href="([^"]+)">(\w+: \d+)</a>', rows.split('id="row-backends"')[1]))
    assert sorted(links.values()) == ["north: 2", "south: 3"]
    north = next(url for url, text in links.items() if text == "north: 2").replace("&amp;", "&")
    assert listed(staffer, north) == {"orc-n1", "orc-n2"}
    steps = page.split('id="steps"')[1]
    assert "<th>backend</th>" in steps and '<td class="backend">north</td>' in steps


def test_a_site_whose_modules_have_one_backend_shows_no_backend(staffer, module):
    ended = make_run(status=RunStatus.ABORTED, name="orc raid", cleanup_status="pending")
    make_rows(make_step(ended), ["orc-1"], placeholder=False)
    outages.mark_down("test", by="alice", reason="deploy")
    ledger = staffer.get(LEDGER).content.decode()
    assert "backend" not in ledger
    assert "backend" not in staffer.get(reverse("admin:cleanup_step_changelist")).content.decode()
    row = Resource.objects.get()
    assert "backend" not in staffer.get(reverse("admin:cleanup_resource_change", args=[row.pk])).content.decode()
    step = Step.objects.get()
    assert "backend" not in staffer.get(reverse("admin:cleanup_step_change", args=[step.pk])).content.decode()
    assert "backend" not in staffer.get(reverse("admin:cleanup_run_change", args=[ended.pk])).content.decode()
