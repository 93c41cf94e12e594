"""End to end, in a real browser: the demo's story in the admin, and a person's retry.

Runs `make demo` (shard, cluster and web server), waits for its story, then logs in to
the admin with Debian's Chromium driven by Playwright, finds the run whose cleanup met
the shard fault, and asks for its cleanup with the admin action; the cluster gives the
wolves back.
"""

import os
import re
import shutil
import time

import pytest

from tests.demo import Demo

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)"),
    pytest.mark.timeout(400),
]


@pytest.fixture
def demo(tmp_path):
    demo = Demo(tmp_path, story=True)
    try:
        demo.read_until("the story is told", 240)
        demo.password = re.search(r"user demo\s+password (\S+)", "".join(demo.lines))[1]
        yield demo
    finally:
        demo.stop()


def test_a_person_sees_the_story_in_the_admin_and_retries_the_failed_cleanup(demo, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url = demo.url
    hunt = re.search(r"run (\d+) waits for a person", "".join(demo.lines))
    assert hunt, "the demo did not leave a run waiting for a person"
    hunt_id = hunt[1]

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        page = browser.new_page()
        try:
            page.goto(f"{url}/admin/login/")
            page.fill("#id_username", "demo")
            page.fill("#id_password", demo.password)
            page.click("input[type=submit]")
            expect(page.locator("#site-name")).to_be_visible()

            page.goto(f"{url}/admin/cleanup/run/")
            table = page.locator("#result_list")
            for name in ("Wolf hunt", "Orc invasion", "Goblin night", "Festival boost to 3", "Festival boost to 5"):
                expect(table).to_contain_text(name)
            row = table.locator("tr", has_text="Wolf hunt")
            expect(row).to_contain_text("incomplete")

            page.goto(f"{url}/admin/cleanup/run/{hunt_id}/change/")
            expect(page.locator("body")).to_contain_text("the shard is down")  # the rows show their last error

            page.goto(f"{url}/admin/cleanup/run/?cleanup_status__exact=incomplete")
            page.locator("#result_list tr", has_text="Wolf hunt").locator("input.action-select").check()
            page.select_option("select[name=action]", "clean_up")
            page.click("button[name=index]")
            expect(page.locator(".messagelist")).to_contain_text("Cleanup queued for 1 run(s).")

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                page.goto(f"{url}/admin/cleanup/run/{hunt_id}/change/")
                if "complete" in page.locator(".field-cleanup_status").inner_text().split():
                    break
                time.sleep(1)
            page.screenshot(path=str(tmp_path / "wolf-hunt.png"), full_page=True)
            expect(page.locator(".field-cleanup_status")).to_contain_text("complete")
            expect(page.locator("body")).to_contain_text("cleanup.retry")
        finally:
            browser.close()
