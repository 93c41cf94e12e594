"""In a real browser, at 1280x800 and 1920x1080: what a person on a live night sees.

Debian's Chromium driven by Playwright against a live server of its own. A fleet with one
backend down; a run whose cleanup gave up, its 8 wolves (refs that share a long start, a
long last error) beside their step's placeholder, its first attempt failed; a run a person
left for later; a patrol given back; a watch still running. Its times in order (created,
spawned, ended, given up). At each size the test walks the issue's points: the index
(left for later counted apart from given up, 8 waiting and not 9, the night in charts, live
without a reload), the runs' list (8, as the index), a run's page (what waits for a person
above the timeline, on the first screen, no empty Close bar and no empty strip above
"Ledger rows"; its heading, states and rows saying 8; refs whole with the copy button right
after their end; the last error not cut at 70; times dated with their zone; the failed
attempt drawn), the ledger (every column on screen; an open ledger nothing changes answered
304), module health (state, since when, why and who in one cell that fits; live; a link to
the rows the down backend holds), the runs' filters (backend, who started, date), the start
form's help naming the shard, a row's own page, the site's own 404 page, and *Clean up now*
and *End now*, each answered with the run's page as it now stands, never contradicting
itself. Screenshots go to var/night-screenshots/ (``night-*.png``), or to ``NIGHT_SCREENSHOTS``.
"""

import os
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
# Under var/ (ignored): a test run leaves the tree as it found it. The README's pictures are
# refreshed on purpose: NIGHT_SCREENSHOTS=docs/img, see docs/contributing.md.
SHOTS = Path(os.environ.get("NIGHT_SCREENSHOTS", django_settings.BASE_DIR / "var" / "night-screenshots"))
SIZES = [(1280, 800), (1920, 1080)]
# Refs as a Luanti world names its objects: a long start shared by every row, told apart by the end.
PREFIX = "world-north:mobs_animal:wolf:2f9c1e0a-7d4b-4c55-"
LONG_ERROR = (
    "refused: the wolf is in combat with a player and will not leave until the fight ends; "
    "the server keeps it in its world"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)"),
    pytest.mark.timeout(300),
]


@pytest.fixture
def night(live_server, transactional_db, settings):
    from django.contrib.auth.models import User
    from django.utils import timezone

    from cleanup import counters, registry
    from cleanup.models import LogKind, ModuleHealth, Resource, Run, RunLog, RunStatus
    from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

    settings.EVENT_ADMIN_REFRESH_S = 1
    now = timezone.now()
    # A night in order: the hunt created, its wolves spawned, the hunt ended, its cleanup given up.
    created, spawned, ended, gave_up = (now - timedelta(minutes=m) for m in (40, 38, 30, 25))
    hunt = make_run(
        status=RunStatus.COMPLETED,
        name="Wolf hunt in the northern pine forest (its wolves refuse to leave)",
        cleanup_status="incomplete",
        started_by="ann",
        ended_at=ended,
    )
    Run.objects.filter(pk=hunt.pk).update(created_at=created)
    hunt.refresh_from_db()
    step = make_step(hunt, backend="north", started_at=created, finished_at=spawned, attempts=2)
    # Its first attempt failed (the shard timed out), its second spawned the wolves.
    failed = RunLog.write(hunt.pk, LogKind.STEP_FAILED, step=0, action="test.spawn", error="the shard timed out")
    RunLog.objects.filter(pk=failed.pk).update(at=created + timedelta(seconds=30))
    wolves = make_rows(step, [f"{PREFIX}{i:012d}" for i in range(8)])  # with the step's placeholder
    Resource.objects.filter(step=step).update(
        state="failed",
        revert_attempts=3,
        backend="north",
        created_at=spawned,
        updated_at=gave_up,
    )
    Resource.objects.filter(pk__in=[w.pk for w in wolves[1:]]).update(
        last_error=LONG_ERROR, payload={"entity": "wolf", "at": [12, 8, -40]}
    )
    left = make_run(
        status=RunStatus.CANCELLED,
        name="Goblin night (left for later)",
        auto_cleanup=False,
        cleanup_status="left",
        started_by="bob",
        ended_at=now - timedelta(minutes=10),
    )
    Run.objects.filter(pk=left.pk).update(created_at=now - timedelta(minutes=20))
    goblins = make_rows(make_step(left, backend="south"), ["goblin-1", "goblin-2"], placeholder=False)
    Resource.objects.filter(pk__in=[g.pk for g in goblins]).update(
        backend="south", payload={"creature": "goblin", "at": "cave"}, created_at=now - timedelta(minutes=19)
    )
    ModuleHealth.objects.create(
        module="test",
        backend="south",
        state="down",
        down_since=now - timedelta(minutes=3),
        last_error="connection refused by 10.0.0.7:30000 (the shard's process is not running)",
        changed_by="engine",
        failures_in_row=3,
    )
    ModuleHealth.objects.create(module="test", backend="north")
    # A patrol given back a few minutes ago, and calls counted by the metrics: the night's charts.
    # The module gives back what it is asked to (a person's Clean up now, End now).
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    patrol = make_run(
        status=RunStatus.COMPLETED, name="Ogre patrol", cleanup_status="complete", ended_at=now - timedelta(minutes=4)
    )
    Run.objects.filter(pk=patrol.pk).update(created_at=now - timedelta(minutes=12))
    ogres = make_rows(make_step(patrol, backend="north"), [f"ogre-{i}" for i in range(5)], placeholder=False)
    Resource.objects.filter(pk__in=[o.pk for o in ogres]).update(
        state="reverted",
        backend="north",
        created_at=now - timedelta(minutes=11),
        resolved_at=now - timedelta(minutes=2),
    )
    # A watch still running, its trolls held on the east shard: a person ends it.
    watch = make_run(status=RunStatus.RUNNING, name="Troll watch on the east ridge", started_by="ann")
    Run.objects.filter(pk=watch.pk).update(created_at=now - timedelta(minutes=9))
    trolls = make_rows(make_step(watch, backend="east"), ["troll-1", "troll-2"], placeholder=False)
    Resource.objects.filter(pk__in=[t.pk for t in trolls]).update(
        backend="east", payload={"creature": "troll", "at": "ridge"}, created_at=now - timedelta(minutes=8)
    )
    for backend, outcome, seconds in [("north", "ok", 0.2), ("south", "timeout", 10.0), ("south", "error", 0.1)]:
        labels = {"module": "test", "backend": backend, "verb": "revert"}
        counters.add("module_calls_total", {**labels, "outcome": outcome})
        counters.observe("module_call_seconds", labels, seconds)
    counters.flush()
    User.objects.create_superuser("root", password="pw-123456789")
    yield {"url": live_server.url, "hunt": hunt, "left": left, "patrol": patrol, "watch": watch}
    registry.unregister_module("test")


def launch(pw):
    return pw.chromium.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"],
    )


def shot(page, name, width):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"night-{name}-{width}.png"))


def no_sideways_scroll(page, width):
    assert page.evaluate("document.documentElement.scrollWidth") <= width, "the page scrolls sideways"


def within(page, selector, width):
    box = page.locator(selector).first.bounding_box()
    assert box and box["x"] + box["width"] <= width, f"{selector} runs off the right edge"
    return box


def copy_beside_last_part(page, selector):
    """The copy button sits on the line of its identifier's last part, right after it."""
    found = page.evaluate(
        """(selector) => {
            const box = document.querySelector(selector);
            const lines = box.querySelector('.ident').getClientRects();
            const last = lines[lines.length - 1];
            const button = box.querySelector('button.copy').getBoundingClientRect();
            return {top: last.top, bottom: last.bottom, right: last.right, lines: lines.length,
                    middle: (button.top + button.bottom) / 2, left: button.left};
        }""",
        selector,
    )
    assert found["top"] <= found["middle"] <= found["bottom"], f"the copy button is not on the ref's last line: {found}"
    assert found["left"] >= found["right"] - 1, f"the copy button is not after the ref's end: {found}"
    return found


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_a_person_on_a_live_night_sees_reasons_whole_and_current(night, monkeypatch, width, height):
    from django.utils import timezone
    from playwright.sync_api import expect, sync_playwright

    from cleanup.models import ModuleHealth, Resource
    from tests.fakes import make_rows, make_step

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    url, hunt = night["url"], night["hunt"]
    ref0 = f"{PREFIX}{0:012d}"
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": width, "height": height})
        fragments: list[tuple[str, int]] = []
        page.on("response", lambda r: fragments.append((r.url, r.status)) if "/live" in r.url else None)
        try:
            page.goto(f"{url}/admin/login/")
            expect(page.locator("#site-name")).to_contain_text("Eventsite staff")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw-123456789")
            page.click("input[type=submit]")

            # The index (point 4): a run left for later is counted apart from a cleanup that
            # gave up; the step's placeholder beside its 8 wolves is not a ninth.
            expect(page.locator("#count-incomplete-runs")).to_have_text("1")
            expect(page.locator("#count-left-runs")).to_have_text("1")
            expect(page.locator("#count-left")).to_have_text("2")
            expect(page.locator("#count-waiting")).to_have_text("8")
            # The night in charts (point 8): rows given back per minute, latency and failures by backend.
            expect(page.locator("#chart-given-back")).to_contain_text("total 5")
            expect(page.locator("#chart-failures")).to_contain_text("test/south")
            expect(page.locator("#chart-latency")).to_contain_text("test/north")
            within(page, "#night-charts", width)
            no_sideways_scroll(page, width)
            page.locator("#night-charts").scroll_into_view_if_needed()
            shot(page, "index", width)
            # Live like the index's counts: two more ogres given back show without a reload.
            expect(page.locator("#live-state")).to_have_text("Live")
            page.evaluate("window.notReloaded = true")
            patrol = night["patrol"]
            more = make_rows(make_step(patrol, backend="north"), ["ogre-5", "ogre-6"], placeholder=False)
            Resource.objects.filter(pk__in=[o.pk for o in more]).update(
                state="reverted", backend="north", resolved_at=timezone.now()
            )
            expect(page.locator("#chart-given-back")).to_contain_text("total 7", timeout=15_000)
            assert page.evaluate("window.notReloaded") is True, "the index was reloaded"
            page.goto(f"{url}/admin/cleanup/run/{patrol.pk}/change/")
            expect(page.locator("#chart-run-given-back")).to_contain_text("total 7")

            # The runs' list counts the hunt's waiting rows as the index does.
            page.goto(f"{url}/admin/cleanup/run/?q=Wolf+hunt")
            expect(page.locator("#result_list td.field-unresolved")).to_have_text("8")
            expect(page.locator("#result_list")).to_contain_text(hunt.name)  # run names whole (point 3)

            # A run's page opens on what needs a person: its rows with their reasons, first (point 5).
            page.goto(f"{url}/admin/cleanup/run/{hunt.pk}/change/")
            expect(page.locator(".breadcrumbs")).to_contain_text(f"#{hunt.pk} {hunt.name}")  # point 9
            rows = page.locator("#rows").bounding_box()
            assert rows["y"] < height * 0.6, "the rows waiting for a person are below the first screen"
            assert rows["y"] < page.locator("#timeline").bounding_box()["y"], "the timeline comes before the rows"
            assert page.locator(".submit-row").count() == 0, "an empty Close bar"
            # No empty strip above "Ledger rows": its heading starts below the run's fields, one line high.
            form = page.locator("#run_form").bounding_box()
            heading = page.locator("#rows h2").bounding_box()
            assert heading["y"] >= form["y"] + form["height"], "the rows' heading is painted behind the run's fields"
            assert heading["height"] < 48, f"an empty strip above 'Ledger rows' ({heading['height']} px high)"
            # One count of waiting rows: the heading, the states and the rows listed say 8, as the index.
            expect(page.locator("#rows h2")).to_contain_text("8 unresolved")
            expect(page.locator("#row-counts")).to_contain_text("failed: 8 (and 1 step placeholder")
            expect(page.locator("#rows tbody tr")).to_have_count(8)
            # Times dated, with their zone (point 8); the run created before it ended (its fixture in order).
            created = page.locator(".fieldBox.field-created .readonly").inner_text()
            ended = page.locator(".fieldBox.field-ended .readonly").inner_text()
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", created), created
            assert created < ended, f"ended {ended} before it was created {created}"
            # Refs whole (point 3): the whole value on screen, the copy button right after its end.
            expect(page.locator("#rows tbody tr").first).to_contain_text(ref0)
            for i in (0, 7):
                expect(page.locator("#rows tbody")).to_contain_text(f"{PREFIX}{i:012d}")
            copy = page.locator("#rows button.copy").first
            assert copy.get_attribute("data-copy") == ref0
            copy_beside_last_part(page, "#rows tbody tr .ident-box")
            expect(page.locator("#rows tbody")).to_contain_text("wolf at 12,8,-40")  # a row's what (point 3)
            expect(page.locator("#rows tbody tr").first).to_contain_text(LONG_ERROR)  # not cut at 70
            # Its timeline draws the step and its failed first attempt (point 8).
            expect(page.locator("#timeline svg circle.step")).to_have_count(1)
            expect(page.locator("#timeline svg path.step-failed")).to_have_count(1)
            within(page, "#rows table", width)
            no_sideways_scroll(page, width)
            shot(page, "run", width)

            # The ledger: every column on screen, refs whole, times dated.
            page.goto(f"{url}/admin/cleanup/resource/?needs=waiting")
            expect(page.locator("#result_list tbody tr")).to_have_count(8)
            expect(page.locator("#result_list")).to_contain_text(f"{PREFIX}{7:012d}")
            copy_beside_last_part(page, "#result_list tbody tr .ident-box")
            expect(page.locator("#result_list td.field-updated_short").first).to_contain_text("UTC")
            expect(page.locator("#result_list td.field-error").first).to_contain_text(LONG_ERROR)
            expect(page.locator("#result_list td.field-run_name").first).to_contain_text(hunt.name)
            right = min(width, page.locator("#changelist-filter").bounding_box()["x"])
            for column in ("ref_short", "what", "state_shown", "attempt", "error", "run_name", "updated_short"):
                box = page.locator(f"th.column-{column}").bounding_box()
                assert box and box["x"] + box["width"] <= right + 1, f"the {column} column is off-screen"
            no_sideways_scroll(page, width)
            shot(page, "ledger", width)
            # An open ledger nothing changes is not sent again (point 8): its reads answer 304, no body.
            expect(page.locator("#live-bar")).to_have_attribute(
                "data-unchanged", re.compile(r"^([2-9]|\d\d+)$"), timeout=20_000
            )
            ledger_reads = [status for where, status in fragments if "/resource/live/" in where]
            assert 304 in ledger_reads, ledger_reads
            expect(page.locator("#live-age")).to_contain_text("updated")

            # Module health: state, since when, why and who in one cell, on screen.
            page.goto(f"{url}/admin/cleanup/modulehealth/")
            cell = page.locator("td.field-health_shown").filter(has_text="down")
            expect(cell).to_contain_text("since")
            expect(cell).to_contain_text("why: connection refused by 10.0.0.7:30000")
            expect(cell).to_contain_text("by engine")
            within(page, "td.field-health_shown", width)
            no_sideways_scroll(page, width)
            # Every column on screen, none pushed off to the right inside the table (point 1).
            results = page.locator("#changelist .results")
            assert results.evaluate("e => e.scrollWidth <= e.clientWidth"), "module health scrolls sideways inside"
            shot(page, "module-health", width)
            # Live like the other pages: a new reason shows without a reload.
            expect(page.locator("#live-state")).to_have_text("Live")
            page.evaluate("window.notReloaded = true")
            ModuleHealth.objects.filter(backend="south").update(last_error="disk full on the shard's host")
            expect(cell).to_contain_text("why: disk full on the shard's host", timeout=15_000)
            assert page.evaluate("window.notReloaded") is True
            cell.locator("a.health-rows").click()
            expect(page.locator("#result_list tbody tr")).to_have_count(2)
            expect(page.locator("#result_list")).to_contain_text("goblin-1")

            # The runs: by backend, by who started them, by date.
            page.goto(f"{url}/admin/cleanup/run/")
            expect(page.locator("#changelist-filter")).to_contain_text("started by")
            page.locator("#changelist-filter a", has_text="bob").click()
            expect(page.locator("#result_list tbody tr")).to_have_count(1)
            expect(page.locator("#result_list")).to_contain_text("Goblin night (left for later)")
            page.goto(f"{url}/admin/cleanup/run/?backend=north")
            expect(page.locator("#result_list tbody tr")).to_have_count(2)
            expect(page.locator("#result_list")).to_contain_text("Wolf hunt in the northern pine forest")
            expect(page.locator("#result_list")).not_to_contain_text("Goblin night")
            page.locator("#changelist-filter a", has_text="Today").click()
            expect(page.locator("#result_list tbody tr")).to_have_count(2)
            shot(page, "runs-filtered", width)

            # The start form's help for sandbox.spawn (the example site's module) names its shard (point 6).
            page.goto(f"{url}/admin/cleanup/run/add/")
            spawn_help = page.locator("#installed-actions tr").filter(
                has=page.locator("td:first-child", has_text=re.compile(r"^sandbox\.spawn$"))
            )
            expect(spawn_help).to_contain_text('"shard": "north"')
            within(page, "#installed-actions table", width)

            # A row's own page: its ref whole, the copy button after its end (point 3).
            wolf = Resource.objects.get(ref=ref0)
            page.goto(f"{url}/admin/cleanup/resource/{wolf.pk}/change/")
            expect(page.locator("#content")).to_contain_text(ref0)
            copy_beside_last_part(page, "#content .ident-box")
            no_sideways_scroll(page, width)

            # The site's own 404, in the admin's look.
            page.goto(f"{url}/nothing-here/")
            expect(page.locator("h1")).to_have_text("Page not found")
            expect(page.locator("#site-name")).to_contain_text("Eventsite staff")
            shot(page, "not-found", width)

            # Clean up now (point 2): confirmed, then the page as it now stands, never contradicting
            # itself: complete beside no unresolved row and no second Clean up now.
            page.goto(f"{url}/admin/cleanup/run/{hunt.pk}/change/")
            page.click("#clean-up-now")
            expect(page.locator("#content")).to_contain_text("Rows reset: 8 failed")  # as the index counts
            page.click("#confirm-action")
            expect(page.locator(".messagelist")).to_contain_text("Cleanup queued")
            expect(page.locator(".fieldBox.field-cleanup_status .readonly")).to_have_text("complete")
            expect(page.locator("#rows h2")).not_to_contain_text("unresolved")
            expect(page.locator("#row-counts")).to_contain_text("reverted: ")
            expect(page.locator("#row-counts")).not_to_contain_text("failed")
            expect(page.locator("#clean-up-now")).to_have_count(0)

            # End now (point 2): the running watch ends, giving back, its page as it now stands.
            page.goto(f"{url}/admin/cleanup/run/{night['watch'].pk}/change/")
            expect(page.locator("#rows h2")).to_contain_text("2 held by the running run")
            page.click("#end-now")
            page.check("#end-give")
            page.click("#confirm-end")
            expect(page.locator(".fieldBox.field-status .readonly")).to_have_text("cancelled")
            expect(page.locator(".fieldBox.field-cleanup_status .readonly")).to_have_text("complete")
            expect(page.locator("#rows h2")).to_have_text("Ledger rows: 2")
            expect(page.locator("#row-counts")).to_have_text("reverted: 2")
            expect(page.locator("#clean-up-now")).to_have_count(0)
            expect(page.locator("#end-now")).to_have_count(0)
            shot(page, "run-ended", width)
        finally:
            browser.close()
