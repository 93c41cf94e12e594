"""In a real browser at 1,280 px: a run started, run again and ended from the admin, each
through its confirmation and behind its permission, and a timeline that tells the truth
(the given-back curve at the end, an outage band, the picture as wide as the page).

A live site of its own (Django's live server, django-q2 in sync mode, so a start's tick
and an end's cleanup run at once) with one in-memory module, `test.spawn`. Debian's
Chromium driven by Playwright; screenshots go to ``var/e2e-screenshots/`` (or
``E2E_SCREENSHOTS``).
"""

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from tests.test_e2e_browser import CHROMIUM, WIDTH, launch, shot

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)"),
    pytest.mark.timeout(300),
]

PASSWORD = "pw-123456789"


@pytest.fixture
def site(live_server, transactional_db):
    """A live site with `test.spawn` installed, a superuser, a staff user who may only look,
    and an ended run whose backend went down and came back while it ran."""
    from django.contrib.auth.models import Permission, User
    from django.utils import timezone

    from cleanup import registry
    from cleanup.models import ModuleEvent, Resource, Run, RunLog, RunStatus
    from tests.fakes import FakeAction, Scripted, despawner, make_rows, make_step, spawner

    class Spawn(FakeAction):
        """``test.spawn``: ``{"creature": "orc", "count": 5}``: spawns ``count`` creatures."""

        def validate(self, params):
            if not isinstance(params.get("count"), int) or params["count"] < 1:
                raise ValueError(f"count must be a whole number from 1, got {params.get('count')!r}")

    world = {}
    registry.register_action(Spawn(perform=Scripted(spawner(world)), revert=Scripted(despawner(world))))
    User.objects.create_superuser("root", password=PASSWORD)
    looker = User.objects.create_user("looker", password=PASSWORD, is_staff=True)
    for codename in ("view_run", "view_resource", "view_step"):
        looker.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="cleanup"))

    now = timezone.now()
    began = now - timedelta(minutes=4)
    night = Run.objects.create(
        name="Stormy night", status=RunStatus.COMPLETED, cleanup_status="complete", ended_at=now - timedelta(seconds=5)
    )
    Run.objects.filter(pk=night.pk).update(created_at=began)
    rows = make_rows(make_step(night, finished_at=began), [f"orc-{i}" for i in range(6)], placeholder=False)
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(
        created_at=began, backend="south", state="reverted", resolved_at=now
    )
    ModuleEvent.objects.create(
        module="test",
        backend="south",
        kind="module.down",
        at=began + timedelta(seconds=40),
        detail={"error": "connection refused", "by": "engine"},
    )
    ModuleEvent.objects.create(module="test", backend="south", kind="module.up", at=began + timedelta(seconds=150))
    RunLog.objects.create(run=night, kind="cleanup.recovered", at=now, detail={})
    yield {"url": live_server.url, "night": night.pk, "world": world}
    registry.unregister_module("test")


def db(query):
    """Run an ORM query beside Playwright's event loop, which Django refuses to query from."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(query).result()


def log_in(page, url, user):
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")


def test_a_person_starts_runs_again_and_ends_a_run_each_confirmed(site):
    from playwright.sync_api import expect, sync_playwright

    from cleanup.models import Resource, Run

    url = site["url"]
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            # A staff user who may only look is offered none of it, and refused the pages.
            looker = browser.new_page(viewport={"width": WIDTH, "height": 900})
            log_in(looker, url, "looker")
            looker.goto(f"{url}/admin/cleanup/run/")
            expect(looker.locator("#start-a-run")).to_have_count(0)
            assert looker.goto(f"{url}/admin/cleanup/run/add/").status == 403
            looker.close()

            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            log_in(page, url, "root")
            page.goto(f"{url}/admin/cleanup/run/")
            page.click("#start-a-run")
            expect(page.locator("#installed-actions")).to_contain_text("test.spawn")
            expect(page.locator("#installed-actions")).to_contain_text('{"creature": "orc", "count": 5}')
            shot(page, "runs-1-start-form")

            # A bad step is refused beside it, with the engine's words; nothing starts.
            page.fill("#id_name", "Orc raid")
            page.select_option("#id_step-0-action", "test.spawn")
            page.fill("#id_step-0-params", json.dumps({"creature": "orc", "count": 0}))
            page.select_option("#id_step-1-action", "core.wait")
            page.fill("#id_step-1-params", json.dumps({"seconds": 600}))
            page.click("#review-run")
            expect(page.locator("#step-line-0 .step-errors")).to_contain_text(
                "steps[0].params: count must be a whole number from 1, got 0"
            )
            expect(page.locator("#step-line-1 .step-errors")).to_be_empty()
            expect(page.locator("#id_name")).to_have_value("Orc raid")
            assert not db(Run.objects.filter(name="Orc raid").exists)
            for selector in ("#step-line-0 .step-errors", "#review-run"):
                box = page.locator(selector).bounding_box()
                assert box and box["x"] + box["width"] <= WIDTH, f"{selector} is off-screen"
            shot(page, "runs-2-start-refused")

            # Fixed, reviewed, confirmed: the run starts and its page opens.
            page.fill("#id_step-0-params", json.dumps({"creature": "orc", "count": 3}))
            page.click("#review-run")
            expect(page.locator("#confirm-steps")).to_contain_text("test.spawn")
            expect(page.locator("#confirm-steps")).to_contain_text('"count": 3')
            assert not db(Run.objects.filter(name="Orc raid").exists), "started before it was confirmed"
            shot(page, "runs-3-start-confirm")
            page.click("#confirm-start")
            expect(page.locator(".messagelist")).to_contain_text("Started run #")
            raid = db(lambda: Run.objects.get(name="Orc raid"))
            assert page.url.endswith(f"/admin/cleanup/run/{raid.pk}/change/")
            expect(page.locator("#rows")).to_contain_text("Ledger rows: 4")  # with the step's own
            expect(page.locator("#end-now")).to_be_visible()
            shot(page, "runs-4-started")

            # End now: the confirmation lists what will be given back, then the run's page.
            page.click("#end-now")
            expect(page.locator("#give-back-title")).to_contain_text("It holds 3 row(s)")
            for ref in db(
                lambda: list(Resource.objects.filter(run=raid).exclude(kind="step").values_list("ref", flat=True))
            ):
                expect(page.locator("#end-run table.give-back")).to_contain_text(ref)
            expect(page.locator("#end-run")).to_contain_text("1 step(s) not yet finished will not be performed")
            shot(page, "runs-5-end-confirm")
            page.check("#end-give")
            page.click("#confirm-end")
            assert page.url.endswith(f"/admin/cleanup/run/{raid.pk}/change/")
            expect(page.locator(".messagelist")).to_contain_text("Ended now, giving back what it took")
            expect(page.locator(".fieldBox.field-status .readonly")).to_have_text("cancelled")
            expect(page.locator("#rows")).to_contain_text("reverted: 4")
            assert site["world"] == {}, "what the run took is still in the world"
            shot(page, "runs-6-ended")

            # Run again: the steps copied, changed, confirmed: a new run.
            page.click("#run-again")
            expect(page.locator("#id_name")).to_have_value("Orc raid")
            expect(page.locator("#id_step-0-action")).to_have_value("test.spawn")
            expect(page.locator("#id_step-1-action")).to_have_value("core.wait")
            page.fill("#id_name", "Orc raid, second wave")
            page.fill("#id_step-0-params", json.dumps({"creature": "orc", "count": 2}))
            shot(page, "runs-7-run-again")
            page.click("#review-run")
            page.click("#confirm-start")
            wave = db(lambda: Run.objects.get(name="Orc raid, second wave"))
            assert page.url.endswith(f"/admin/cleanup/run/{wave.pk}/change/")
            expect(page.locator("#rows")).to_contain_text("Ledger rows: 3")

            page.goto(f"{url}/admin/")
            expect(page.locator("#recent-actions-module")).to_contain_text("Orc raid, second wave")
        finally:
            browser.close()


def test_the_timeline_shows_the_give_back_at_the_end_and_the_outage_band_across_the_page(site):
    from playwright.sync_api import expect, sync_playwright

    url = site["url"]
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        try:
            log_in(page, url, "root")
            page.goto(f"{url}/admin/cleanup/run/{site['night']}/change/")
            svg = page.locator("#timeline svg")
            expect(svg).to_be_visible()
            # As wide as the page's content, at 1,920 px as at 1,280.
            page.set_viewport_size({"width": 1920, "height": 900})
            wide = page.locator("#timeline").bounding_box()
            assert svg.bounding_box()["width"] >= wide["width"] - 2 and wide["width"] > 1700, "narrower than the page"
            page.set_viewport_size({"width": WIDTH, "height": 900})
            box = svg.bounding_box()
            assert box["width"] >= page.locator("#timeline").bounding_box()["width"] - 2

            band = page.locator("#timeline rect.outage")
            expect(band).to_have_count(1)
            expect(band.locator("title")).to_contain_text("test/south down from")
            expect(band.locator("title")).to_contain_text("connection refused")
            band_box = band.bounding_box()
            assert band_box["width"] > 0.3 * box["width"], "the outage band is not drawn to its length"

            # The given-back curve reaches the top and goes on past the completion bar.
            given = page.locator('#timeline polyline[data-curve="given back"]').bounding_box()
            bar = page.locator(
                "#timeline rect", has=page.locator("title", has_text="cleanup complete at")
            ).bounding_box()
            assert given["x"] + given["width"] > bar["x"] + bar["width"] + 20, "hidden under the completion bar"
            expect(page.locator("#timeline")).to_contain_text("given back 6")
            page.locator("#timeline").scroll_into_view_if_needed()
            shot(page, "runs-8-timeline")
        finally:
            browser.close()
