"""In a real browser: admin pages that update by themselves, at 1,280 px.

Debian's Chromium driven by Playwright, against a live server of its own (no cluster: the
test itself makes the pass a cluster would). A run whose cleanup is pending is open on
its page; the pass gives its rows back, and the page shows the cleanup complete, the rows
given back and the log's sentence without a reload. The ledger keeps a person's ticked
rows and their search text while its rows change; a row waiting for its backend reads as
waiting, and every column of the list is on screen. "Pause" stops the updates. The index
counts a run that starts. Screenshots go to ``var/e2e-screenshots/`` (or ``E2E_SCREENSHOTS``).
"""

import os
import shutil
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
SHOTS = Path(os.environ.get("E2E_SCREENSHOTS", django_settings.BASE_DIR / "var" / "e2e-screenshots"))
WIDTH = 1280
# Generous: the page reads itself every second here, and the machine is shared.
SEEN_WITHIN_MS = 15_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)"),
    pytest.mark.timeout(300),
]


@pytest.fixture
def site(live_server, transactional_db, settings):
    """A live site: an ended run whose four orc rows wait for their pass, a wolf at its ceiling."""
    from django.contrib.auth.models import User

    from cleanup import registry
    from cleanup.models import Resource, RunStatus
    from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

    settings.EVENT_ADMIN_REFRESH_S = 1
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    raid = make_run(status=RunStatus.ABORTED, name="orc raid", cleanup_status="pending")
    orcs = make_rows(make_step(raid), [f"orc-{i}" for i in range(4)], placeholder=False)
    Resource.objects.filter(pk__in=[r.pk for r in orcs]).update(
        state="failed", revert_attempts=1, last_error="the shard said 503", payload={"creature": "orc", "at": "gate"}
    )
    hunt = make_run(status=RunStatus.ABORTED, name="wolf hunt", cleanup_status="incomplete")
    wolves = make_rows(make_step(hunt), ["wolf-1"], placeholder=False)
    Resource.objects.filter(pk=wolves[0].pk).update(
        state="failed",
        revert_attempts=3,
        last_error="refused: the wolf is in combat and will not leave " * 3,
        payload={"creature": "wolf", "at": "the woods"},
    )
    User.objects.create_superuser("root", password="pw-123456789")
    yield {"url": live_server.url, "raid": raid, "hunt": hunt}
    registry.unregister_module("test")


def launch(pw):
    return pw.chromium.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"],
    )


def shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def all_columns_on_screen(page):
    """Every column of the ledger list on screen, left of its filters, at 1,280 px; no sideways scroll."""
    right = min(WIDTH, page.locator("#changelist-filter").bounding_box()["x"])
    columns = ("ref_short", "what", "state_shown", "attempt", "error", "module_shown", "run_name", "updated_short")
    for column in columns:
        box = page.locator(f"th.column-{column}").bounding_box()
        assert box and box["x"] + box["width"] <= right, f"the {column} column is off-screen or hidden"
    # The results' own box too: a table wider than it runs under the filters.
    results = page.locator("#changelist .results").bounding_box()
    table = page.locator("#result_list").bounding_box()
    assert table["x"] + table["width"] <= results["x"] + results["width"] + 1, "the list runs under the filters"
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH, "the list scrolls sideways"


def updates(page):
    return int(page.locator("#live-bar").get_attribute("data-updates") or 0)


def wait_for_updates(page, more=2):
    # Polled from here: a function evaluated in the page is a string `eval`, which the site's
    # Content-Security-Policy refuses, as it should.
    start = updates(page)
    deadline = time.monotonic() + SEEN_WITHIN_MS / 1000
    while updates(page) < start + more:
        assert time.monotonic() < deadline, f"the page read its fragment {updates(page) - start} times, not {more}"
        page.wait_for_timeout(100)


def test_a_runs_page_shows_its_cleanup_complete_by_itself_and_the_ledger_keeps_a_selection(site, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    # The test makes the cluster's pass itself, between browser steps: Playwright's sync API
    # keeps an event loop on this thread, which Django's ORM would otherwise refuse.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")

    from cleanup import outages
    from cleanup.models import Resource, Run, RunStatus
    from cleanup.sweep import cleanup_run
    from tests.fakes import make_rows, make_run, make_step

    url, raid = site["url"], site["raid"]
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # Every answer the page got was a success (the browser's own favicon.ico aside).
        page.on(
            "response",
            lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 and "favicon" not in r.url else None,
        )
        try:
            page.goto(f"{url}/admin/login/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw-123456789")
            page.click("input[type=submit]")

            # The run's page, pending: then the cluster's pass gives its rows back.
            page.goto(f"{url}/admin/cleanup/run/{raid.pk}/change/")
            expect(page.locator("#live-state")).to_have_text("Live")
            expect(page.locator(".fieldBox.field-cleanup_status .readonly")).to_have_text("pending")
            expect(page.locator("#rows h2")).to_contain_text("4 unresolved")
            page.evaluate("window.notReloaded = true")
            shot(page, "live-1-run-pending")

            cleanup_run(Run.objects.get(pk=raid.pk), by="sweeper")

            status = page.locator(".fieldBox.field-cleanup_status .readonly")
            expect(status).to_have_text("complete", timeout=SEEN_WITHIN_MS)
            expect(page.locator("#rows h2")).not_to_contain_text("unresolved")
            expect(page.locator("#rows tbody")).to_contain_text("reverted")
            expect(page.locator("#log")).to_contain_text("A cleanup pass by sweeper: 4 given back")
            assert "cleanup complete at" in page.locator("#timeline svg[role=img]").inner_html()
            expect(page.locator("#live-age")).to_contain_text("updated")
            assert page.evaluate("window.notReloaded === true"), "the page was reloaded"
            shot(page, "live-2-run-complete-by-itself")

            # Paused: nothing is read until it is live again.
            page.click("#live-toggle")
            expect(page.locator("#live-state")).to_have_text("Paused")
            paused_at = updates(page)
            page.wait_for_timeout(3_000)
            assert updates(page) == paused_at, "a paused page read its fragment"
            page.click("#live-toggle")
            expect(page.locator("#live-state")).to_have_text("Live")
            wait_for_updates(page, 1)

            # The ledger: a person ticks a row and types a search; the list changes under them.
            outages.mark_down("test", backend="north-gate-shard", by="alice", reason="gate shard redeploy")
            page.goto(f"{url}/admin/cleanup/resource/?needs=unresolved")
            wolf = page.locator("#result_list tbody tr", has_text="wolf-1")
            wolf.locator("input.action-select").check()
            page.fill("#searchbar", "troll")
            expect(page.locator(".action-counter")).to_contain_text("1 of")
            another = make_run(status=RunStatus.ABORTED, name="ogre patrol", cleanup_status="pending")
            ogres = make_rows(make_step(another), ["ogre-1"], placeholder=False)
            # A fleet's long backend name, as on a live night.
            Resource.objects.filter(pk=ogres[0].pk).update(backend="north-gate-shard")
            wait_for_updates(page, 2)
            expect(page.locator("#live-new-rows")).to_contain_text("1 new row")
            assert wolf.locator("input.action-select").is_checked(), "the selection was lost"
            assert page.input_value("#searchbar") == "troll", "the typing was lost"
            expect(page.locator(".action-counter")).to_contain_text("1 of")
            all_columns_on_screen(page)
            shot(page, "live-3-ledger-selection-kept")

            # A waiting row reads as waiting, why on its own line.
            page.goto(f"{url}/admin/cleanup/resource/?needs=unresolved")
            ogre = page.locator("#result_list tbody tr", has_text="ogre-1")
            expect(ogre.locator("td.field-state_shown")).to_contain_text("waiting")
            line = ogre.locator("td.field-state_shown .state-line")
            expect(line).to_contain_text("test/north-gate-shard is down since")
            all_columns_on_screen(page)
            shot(page, "live-4-ledger-waiting")

            # Module health: down in red, for how long, its log a click away.
            page.goto(f"{url}/admin/cleanup/modulehealth/")
            test_row = page.locator("#result_list tbody tr", has_text="gate shard redeploy")
            expect(test_row.locator(".health-down")).to_contain_text("down for")
            expect(test_row.locator("a.health-log")).to_have_text("its log")
            shot(page, "live-5-module-health")

            # The index counts a run that starts, by itself, and says what the running runs hold.
            invasion = make_run(status=RunStatus.RUNNING, name="orc invasion")
            spawn = make_step(invasion, status="done")
            orcs = make_rows(spawn, [f"orc-n{i}" for i in range(20)], placeholder=False)
            Resource.objects.filter(pk__in=[r.pk for r in orcs]).update(payload={"creature": "orc", "at": "north-gate"})
            make_step(invasion, action_id="core.wait", params={"seconds": 600}, status="running")
            page.goto(f"{url}/admin/")
            expect(page.locator("#count-running-runs")).to_have_text("1")
            expect(page.locator("#live-now")).to_contain_text("20 orc at north-gate")
            expect(page.locator("#live-now")).to_contain_text("step 2 of 2: core.wait")
            make_run(status=RunStatus.RUNNING, name="goblin night")
            expect(page.locator("#count-running-runs")).to_have_text("2", timeout=SEEN_WITHIN_MS)
            expect(page.locator("#live-now")).to_contain_text("goblin night")
            shot(page, "live-6-index")
            assert errors == [], f"the browser reported errors: {errors}"
        finally:
            browser.close()


def test_a_live_page_whose_session_ended_goes_to_the_login_page_by_itself(site, monkeypatch):
    """The session ends while the page is open (idle, or signed out elsewhere): the page's
    next read is sent to the login, and the page loads it rather than stay stale."""
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    from django.contrib.sessions.models import Session

    url, raid = site["url"], site["raid"]
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        try:
            page.goto(f"{url}/admin/login/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw-123456789")
            page.click("input[type=submit]")
            page.goto(f"{url}/admin/cleanup/run/{raid.pk}/change/")
            expect(page.locator("#live-state")).to_have_text("Live")
            wait_for_updates(page, more=1)

            Session.objects.all().delete()

            expect(page.locator("#id_username")).to_be_visible(timeout=SEEN_WITHIN_MS)
            assert "/admin/login/" in page.url and f"next=/admin/cleanup/run/{raid.pk}/change/" in page.url
            shot(page, "live-session-ended")
        finally:
            browser.close()
