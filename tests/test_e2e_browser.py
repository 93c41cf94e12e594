"""End to end, in a real browser: the demo's story in the admin, a person's retry, and a fleet.

Runs `make demo` (shard, cluster and web server), waits for its story, then logs in to
the admin with Debian's Chromium driven by Playwright at 1,280 px. From the admin index
a staff user follows the count of runs whose cleanup gave up, opens the wolf hunt, reads
a row's errors (a wolf that refused to leave), reads the shard's outage in the modules'
log, asks for "Clean up now", confirms it, and watches the cluster give the
wolves back and the timeline mark the completion. Then, on a site of its own with one
module and two backends: module health lists both, one is marked down through the admin's
action, and only its rows wait. Screenshots go to ``var/e2e-screenshots/`` (or
``E2E_SCREENSHOTS``).
"""

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.databases import scratch_database  # noqa: F401  (the fixture)
from tests.demo import Demo

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
SHOTS = Path(os.environ.get("E2E_SCREENSHOTS", settings.BASE_DIR / "var" / "e2e-screenshots"))
WIDTH = 1280

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)"),
    pytest.mark.timeout(500),
]


@pytest.fixture
def demo(tmp_path, scratch_database):  # noqa: F811
    demo = Demo(tmp_path, story=True, database_url=scratch_database)
    try:
        demo.read_until("the story is told", 300)
        demo.password = re.search(r"user demo\s+password (\S+)", "".join(demo.lines))[1]
        yield demo
    finally:
        demo.stop()


def launch(pw):
    return pw.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )


def shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_a_person_follows_what_needs_them_and_retries_the_failed_cleanup(demo):
    from playwright.sync_api import expect, sync_playwright

    url = demo.url
    hunt = re.search(r"run (\d+) waits for a person", "".join(demo.lines))
    assert hunt, "the demo did not leave a run waiting for a person"
    hunt_id = hunt[1]

    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        try:
            page.goto(f"{url}/admin/login/")
            page.fill("#id_username", "demo")
            page.fill("#id_password", demo.password)
            page.click("input[type=submit]")

            # The index leads with what needs a person.
            expect(page.locator("#needs-attention")).to_contain_text("Runs whose cleanup gave up")
            expect(page.locator("#count-incomplete-runs")).to_have_text("1")
            expect(page.locator("#count-waiting")).not_to_have_text("0")
            expect(page.locator("#count-modules-down")).to_have_text("0")
            waiting = int(page.locator("#count-waiting").inner_text())
            shot(page, "1-admin-index")
            page.click("#count-incomplete-runs")

            table = page.locator("#result_list")
            expect(table).to_contain_text("Wolf hunt")
            expect(table).not_to_contain_text("Orc invasion")
            page.locator("#result_list a", has_text="Wolf hunt").click()

            # The run page: its rows with their errors, its plan and its timeline.
            expect(page.locator("#rows")).to_contain_text("could not give back")
            expect(page.locator("#plan")).to_contain_text("waiting for a person")
            assert "failed attempt" in page.locator("#timeline svg[role=img]").inner_html()
            assert page.locator("input[name=_save]").count() == 0, "the run page can be saved"
            shot(page, "2-run-gave-up")
            top = {"x": 0, "y": 0, "width": WIDTH, "height": 1200}
            page.screenshot(path=str(SHOTS / "run-gave-up-top.png"), clip=top, full_page=True)

            # A row's page: every attempt's error, newest first; no next attempt at the ceiling.
            page.locator("#rows tbody a").first.click()
            expect(page.locator(".field-attempt_history")).to_contain_text("could not give back")
            expect(page.locator(".field-next_try")).to_contain_text("none")
            shot(page, "3-row-attempts")

            # The ledger list fits 1,280 px: state, attempts, error, ref and run are on screen.
            page.goto(f"{url}/admin/cleanup/resource/?needs=waiting")
            right = min(WIDTH, page.locator("#changelist-filter").bounding_box()["x"])
            columns = ("ref_short", "what", "state_shown", "attempt", "error", "module_shown", "run_name")
            for column in (*columns, "updated_short"):
                box = page.locator(f"th.column-{column}").bounding_box()
                assert box and box["x"] + box["width"] <= right, f"the {column} column is off-screen or hidden"
            results = page.locator("#changelist .results").bounding_box()
            table = page.locator("#result_list").bounding_box()
            assert table["x"] + table["width"] <= results["x"] + results["width"] + 1, "the list runs under the filters"
            # The list shows exactly the rows the index counted.
            assert page.locator("#result_list tbody tr").count() == waiting
            shot(page, "4-ledger-waiting")

            # The shard's outage and recovery, in the modules' log.
            page.goto(f"{url}/admin/cleanup/moduleevent/")
            expect(page.locator("#result_list")).to_contain_text("module.down")
            expect(page.locator("#result_list")).to_contain_text("module.up")
            shot(page, "5-module-events")

            # Clean up now: confirmed on a page of its own, then the run's page shows the outcome.
            page.goto(f"{url}/admin/cleanup/run/{hunt_id}/change/")
            page.click("#clean-up-now")
            expect(page.locator("#content")).to_contain_text("Rows reset:")
            expect(page.locator("#content")).to_contain_text("sandbox.spawn.revert")
            shot(page, "6-confirm-clean-up")
            page.click("#confirm-action")
            expect(page.locator(".messagelist")).to_contain_text("Cleanup queued for 1 run(s)")

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                page.goto(f"{url}/admin/cleanup/run/{hunt_id}/change/")
                if "complete" in page.locator(".fieldBox.field-cleanup_status").inner_text().split():
                    break
                time.sleep(1)
            expect(page.locator(".fieldBox.field-cleanup_status")).to_contain_text("complete")
            expect(page.locator("#rows h2")).not_to_contain_text("unresolved")
            expect(page.locator("#rows tbody")).to_contain_text("reverted")
            expect(page.locator("#log")).to_contain_text("cleanup.retry")
            timeline = page.locator("#timeline svg[role=img]").inner_html()
            assert "a person's retry at" in timeline and "cleanup complete at" in timeline
            shot(page, "7-run-cleaned")

            page.goto(f"{url}/admin/")
            expect(page.locator("#count-incomplete-runs")).to_have_text("0")
            expect(page.locator("#recent-actions-module")).to_contain_text("Wolf hunt")
        finally:
            browser.close()


@pytest.fixture
def fleet_site(live_server, transactional_db):
    """A live site with one module of two backends: rows on north and south, north's boot id seen."""
    from django.contrib.auth.models import User

    from cleanup import outages, registry
    from cleanup.models import Resource, RunStatus, Step
    from tests.fakes import FakeAction, make_rows, make_run, make_step

    registry.register_action(FakeAction())
    run = make_run(status=RunStatus.ABORTED, name="orc raid", cleanup_status="pending")
    # east holds rows but was never seen failing: it has no health row yet.
    fleet = (("north", ["orc-n1", "orc-n2"]), ("south", ["orc-s1", "orc-s2", "orc-s3"]), ("east", ["orc-e1"]))
    for backend, refs in fleet:
        step = make_step(run)
        Step.objects.filter(pk=step.pk).update(backend=backend)
        rows = make_rows(step, refs, placeholder=False)
        Resource.objects.filter(pk__in=[r.pk for r in rows]).update(backend=backend)
    outages.note_boot("test", "north", "3f9c2a71-boot")
    outages.mark_down("test", backend="south", by="alice", reason="south is being redeployed")
    User.objects.create_superuser("root", password="pw-123456789")
    yield live_server.url
    registry.unregister_module("test")


def test_module_health_lists_each_backend_and_a_person_marks_one_down(fleet_site):
    from playwright.sync_api import expect, sync_playwright

    url = fleet_site
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        try:
            page.goto(f"{url}/admin/login/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw-123456789")
            page.click("input[type=submit]")

            # The index names the backend down, linking to its rows.
            expect(page.locator("#count-down-test-south")).to_have_text("3")
            shot(page, "fleet-1-index")

            page.goto(f"{url}/admin/cleanup/modulehealth/")
            table = page.locator("#result_list")
            north = table.locator("tr", has=page.locator("td.field-backend_shown", has_text="north"))
            south = table.locator("tr", has=page.locator("td.field-backend_shown", has_text="south"))
            expect(north).to_contain_text("up")
            expect(north.locator("td.field-boot")).to_have_text("3f9c2a71-boot")
            expect(south).to_contain_text("down")
            expect(south).to_contain_text("south is being redeployed")
            # State, since when, why and who are one column (`health_shown`), first after the backend.
            for column in ("module", "backend_shown", "health_shown", "boot", "next_probe"):
                box = page.locator(f"th.column-{column}").bounding_box()
                assert box and box["x"] + box["width"] <= WIDTH, f"the {column} column is off-screen or hidden"
            expect(page.locator("#unseen-backends")).to_contain_text("east")
            shot(page, "fleet-2-module-health")

            # Mark north down: the action asks for the reason first.
            north.locator("input.action-select").check()
            page.select_option("select[name=action]", "mark_down")
            page.click("button[name=index]")
            expect(page.locator("#mark-down-modules")).to_contain_text("test/north (up")
            page.fill("textarea[name=reason]", "north lost its disk")
            shot(page, "fleet-3-mark-down")
            page.click("input[name=apply]")
            expect(page.locator(".messagelist")).to_contain_text("Marked down: test/north.")
            expect(north).to_contain_text("north lost its disk")
            shot(page, "fleet-4-module-health-both-down")

            # The ledger filtered by backend: north's rows wait on north alone.
            page.goto(f"{url}/admin/cleanup/resource/?backend=north")
            expect(page.locator("#result_list tbody tr")).to_have_count(2)
            expect(page.locator("#result_list")).to_contain_text("waiting: test/north is down since")
            expect(page.locator("#result_list")).not_to_contain_text("test/south")
            # Why each row waits wraps: every column stays on screen.
            right = min(WIDTH, page.locator("#changelist-filter").bounding_box()["x"])
            for column in ("ref_short", "state_shown", "module_shown", "attempt", "error", "run_name"):
                box = page.locator(f"th.column-{column}").bounding_box()
                assert box and box["x"] + box["width"] <= right, f"the {column} column is off-screen or hidden"
            shot(page, "fleet-5-ledger-north")

            # The run's page: each row and step with its backend, and a link per backend.
            page.locator("#result_list a", has_text="orc raid").first.click()
            expect(page.locator("#row-backends")).to_contain_text("north: 2")
            expect(page.locator("#row-backends")).to_contain_text("south: 3")
            expect(page.locator("#steps")).to_contain_text("east")
            shot(page, "fleet-6-run")
        finally:
            browser.close()
