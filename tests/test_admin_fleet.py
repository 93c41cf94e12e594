"""The admin of a fleet: one module, two backends (north and south), each with its own health.

What waits shows its own backend's outage; the ledger, the run page, the steps and the
modules' log show and filter by backend; module health lists every backend, and a person
marks one down or up on its own. A site whose modules have one backend each shows none of it.
"""

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup import outages, registry
from cleanup.models import ModuleEvent, ModuleHealth, Resource, RunStatus, Step
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
    assert "waiting: test is down" not in page and "waiting: test/south" not in page

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
    # One column names the module and its backend, as module health does.
    assert headers(page)[:6] == ["ref_short", "what", "state_shown", "attempt", "error", "module_shown"]
    assert re.search(r'<td class="field-module_shown">test/north</td>', page)
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
        listed(staffer, HEALTH)
    distincts = [c["sql"].upper() for c in captured.captured_queries if "DISTINCT" in c["sql"].upper()]
    for sql in (q for q in distincts if "CLEANUP_RESOURCE" in q):
        assert '"STATE" IN (' in sql, f"a DISTINCT over the whole ledger: {sql}"
        assert '"ID"' not in sql.split("FROM")[0], f"a DISTINCT made of every row by its ordering: {sql}"


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


# -- module health: every backend, each marked down and up on its own ----------------------


def health_row(page, name):
    """The list's row of a backend: its module's cell, then (in a fleet) its backend's."""
    module, _, backend = name.partition("/")
    cells = (
        rf"<th class=\"field-module\"><a [^>]*>{module}</a></th><td class=\"field-backend_shown\">{backend or '-'}</td>"
    )
    match = re.search(rf"<tr>(?:(?!</tr>).)*{cells}(?:(?!</tr>).)*</tr>", page, re.S)
    assert match, f"no row for {name}"
    return match[0]


def test_module_health_lists_each_backend_with_its_state_since_error_boot_id_and_next_probe(staffer, fleet):
    outages.mark_down("test", backend="north", by="alice", reason="shard deploy")
    outages.note_boot("test", "south", "boot-4f1c")
    on("east", make_step(fleet["ended"]), ["orc-e1"])  # never seen failing: no health row yet
    page = staffer.get(HEALTH).content.decode()

    north = health_row(page, "test/north")
    health = ModuleHealth.objects.get(module="test", backend="north")
    assert "down" in north and "shard deploy" in north
    assert health.down_since.astimezone().strftime("%H:%M:%S") in north
    assert health.next_probe_at.astimezone().strftime("%H:%M:%S") in north
    south = health_row(page, "test/south")
    assert ">up<" in south and "boot-4f1c" in south and "shard deploy" not in south
    assert ">up<" in health_row(page, "test")

    unseen = page.split('id="unseen-backends"')[1].split("</table>")[0]
    assert re.search(r"<td>test</td><td>east</td><td>up</td>", unseen)
    assert not ModuleHealth.objects.filter(backend="east").exists(), "listing a backend made its row"
    assert "south" not in unseen and "north" not in unseen

    detail = staffer.get(reverse("admin:cleanup_modulehealth_change", args=[health.pk])).content.decode()
    assert "waiting: test/north is down since" in detail and 'name="_save"' not in detail
    assert re.search(r'field-backend_shown.*?<div class="readonly">north</div>', detail, re.S)


def test_module_health_filters_by_backend(staffer, fleet):
    outages.mark_down("test", backend="north", by="alice", reason="deploy")
    outages.note_boot("test", "south", "boot-1")
    names = {ModuleHealth.objects.get(pk=pk).name for pk in listed(staffer, HEALTH + "?backend=north")}
    assert names == {"test/north"}
    only = {ModuleHealth.objects.get(pk=pk).name for pk in listed(staffer, HEALTH + "?backend=/&q=test")}
    assert only == {"test"}, "'/' (no backend's name) lists a module's only backend"


def test_mark_down_marks_the_selected_backend_alone_and_records_it(staffer, fleet):
    outages.note_boot("test", "north", "boot-1")
    north = ModuleHealth.objects.get(module="test", backend="north")
    asked = staffer.post(HEALTH, {"action": "mark_down", "_selected_action": [north.pk]})
    assert asked.status_code == 200 and b'name="reason"' in asked.content
    assert b"test/north (up" in asked.content and b"the module's other backends are worked as usual" in asked.content

    done = staffer.post(
        HEALTH, {"action": "mark_down", "_selected_action": [north.pk], "apply": "1", "reason": "north redeploy"}
    )
    assert done.status_code == 302
    assert outages.down_backends() == {("test", "north")}
    event = ModuleEvent.objects.get()
    assert (event.module, event.backend, event.kind, event.detail["by"]) == ("test", "north", "module.down", "root")
    entry = LogEntry.objects.get(object_id=str(north.pk))
    assert (entry.object_repr, entry.change_message) == ("test/north: down", "Marked down: north redeploy")

    page = staffer.get(LEDGER).content.decode()
    assert page.count("waiting: test/north is down since") == 2 and "waiting: test/south" not in page

    up = staffer.post(HEALTH, {"action": "mark_up", "_selected_action": [north.pk]}, follow=True)
    assert "Marked up: test/north." in up.content.decode()
    assert outages.down_backends() == set()
    assert LogEntry.objects.filter(object_id=str(north.pk)).latest("id").object_repr == "test/north: up"
    again = staffer.post(HEALTH, {"action": "mark_up", "_selected_action": [north.pk]}, follow=True)
    assert "Already up, nothing changed: test/north." in again.content.decode()


def test_a_backend_never_seen_is_marked_down_by_name_and_its_row_made_by_the_engine(staffer, fleet):
    on("east", make_step(fleet["ended"]), ["orc-e1"])
    link = re.search(r'<a href="([^"]+)" class="button">Mark down…</a>', staffer.get(HEALTH).content.decode())[1]
    link = link.replace("&amp;", "&")
    asked = staffer.get(link)
    assert asked.status_code == 200 and b'name="reason"' in asked.content and b"Mark test/east down" in asked.content
    assert not ModuleHealth.objects.filter(backend="east").exists()

    blank = staffer.post(link, {"reason": "  ", "apply": "1"})
    assert blank.status_code == 200 and not ModuleHealth.objects.filter(backend="east").exists()
    done = staffer.post(link, {"reason": "east is flooding", "apply": "1"}, follow=True)
    assert "Marked down: test/east." in done.content.decode()
    assert outages.down_backends() == {("test", "east")}
    health = ModuleHealth.objects.get(module="test", backend="east")
    assert (health.last_error, health.changed_by) == ("east is flooding", "root")
    assert ModuleEvent.objects.get().backend == "east"
    assert LogEntry.objects.get(object_id=str(health.pk)).object_repr == "test/east: down"
    unseen = done.content.decode().split('id="unseen-backends"')[1].split("</table>")[0]
    assert "<td>east</td>" not in unseen and "<td>north</td>" in unseen

    again = staffer.post(link, {"reason": "again", "apply": "1"}, follow=True)
    assert "Already down, nothing changed: test/east." in again.content.decode()
    assert ModuleEvent.objects.count() == 1


def test_marking_a_backend_by_name_refuses_a_bad_name_an_unknown_module_and_a_person_without_the_permission(
    client, staffer, fleet
):
    mark = reverse("admin:cleanup_modulehealth_mark_down")
    for query, said in [
        ("?module=test&backend=a/b", "is not a backend&#x27;s name"),
        ("?module=test&backend=%20north", "is not a backend&#x27;s name"),
        ("?module=test&backend=" + "x" * 101, "is not a backend&#x27;s name"),
        ("?module=nope&backend=north", "No module is named"),
    ]:
        page = staffer.post(mark + query, {"reason": "x", "apply": "1"}, follow=True).content.decode()
        assert said in page, query
    nul = staffer.get(mark + "?module=test&backend=a%00b", follow=True).content.decode()
    assert "the filters were cleared" in nul
    assert not ModuleHealth.objects.exclude(backend="").exists() and not ModuleEvent.objects.exists()

    viewer = User.objects.create_user("viewer", password="pw-123456789", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_modulehealth"))
    client.force_login(viewer)
    assert client.post(mark + "?module=test&backend=north", {"reason": "x", "apply": "1"}).status_code == 403
    assert "Mark down…" not in client.get(HEALTH).content.decode()
    assert not ModuleEvent.objects.exists()


def test_the_modules_log_shows_and_filters_the_backend(staffer, fleet):
    outages.mark_down("test", backend="north", by="alice", reason="deploy")
    outages.mark_down("test", backend="south", by="bob", reason="crash")
    outages.mark_up("test", backend="north", by="alice")
    log = reverse("admin:cleanup_moduleevent_changelist")
    page = staffer.get(log).content.decode()
    assert headers(page)[:3] == ["logged", "module", "backend_shown"]
    assert listed(staffer, log + "?backend=north") == set(
        ModuleEvent.objects.filter(backend="north").values_list("pk", flat=True)
    )
    assert len(listed(staffer, log + "?backend=south")) == 1
    event = ModuleEvent.objects.get(backend="south")
    detail = staffer.get(reverse("admin:cleanup_moduleevent_change", args=[event.pk])).content.decode()
    assert re.search(r'field-backend_shown.*?<div class="readonly">south</div>', detail, re.S)


def test_the_index_links_each_backend_down_to_its_unresolved_rows(staffer, fleet):
    outages.mark_down("test", backend="north", by="alice", reason="deploy")
    page = staffer.get(reverse("admin:index")).content.decode()
    assert re.search(r'id="count-modules-down"[^>]*>1<', page)
    link = re.search(r'<a href="([^"]+)" id="count-down-test-north"[^>]*>(\d+)<', page)
    assert link and link[2] == "2"
    assert "test/north down since" in page and "test/south" not in page
    assert listed(staffer, link[1].replace("&amp;", "&")) == {"orc-n1", "orc-n2"}

    outages.mark_down("test", by="alice", reason="the whole module")
    on("", make_step(fleet["ended"]), ["orc-1"])
    page = staffer.get(reverse("admin:index")).content.decode()
    only = re.search(r'<a href="([^"]+)" id="count-down-test"[^>]*>(\d+)<', page)
    assert only and only[2] == "1"
    assert listed(staffer, only[1].replace("&amp;", "&")) == {"orc-1"}


def test_the_index_of_a_site_with_one_backend_per_module_lists_no_backend(staffer, module):
    outages.mark_down("test", by="alice", reason="deploy")
    page = staffer.get(reverse("admin:index")).content.decode()
    assert re.search(r'id="count-modules-down"[^>]*>1<', page) and "count-down-" not in page
