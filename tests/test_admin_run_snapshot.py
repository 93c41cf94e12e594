"""A run's page and its live fragment read status, counts, rows and actions in one snapshot:
a pass that lands while the page is being read does not make it contradict itself."""

import threading

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from cleanup.admin.runs import RunAdmin
from cleanup.models import Resource, Run, RunStatus
from tests.fakes import make_rows, make_run, make_step

pytestmark = pytest.mark.django_db(transaction=True)


def a_pass_lands_elsewhere(run_id):
    """What a sweeper's pass commits, from another connection: the rows back, the run complete."""

    def give_back():
        try:
            Resource.objects.filter(run_id=run_id).update(state="reverted", resolved_at=timezone.now())
            Run.objects.filter(pk=run_id).update(cleanup_status="complete")
        finally:
            connection.close()

    worker = threading.Thread(target=give_back)
    worker.start()
    worker.join()


@pytest.mark.parametrize("page", ["admin:cleanup_run_change", "admin:cleanup_run_live"])
def test_a_pass_landing_mid_read_leaves_the_page_as_of_one_moment(client, monkeypatch, page):
    run = make_run(status=RunStatus.ABORTED, name="raid", cleanup_status="pending")
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    User.objects.create_superuser("root", password="pw-123456789")
    client.login(username="root", password="pw-123456789")
    read_rows = RunAdmin.ledger_part

    def racing(self, request, run_, steps, live_read):
        a_pass_lands_elsewhere(run.pk)  # after the status was read, before the rows are
        return read_rows(self, request, run_, steps, live_read)

    monkeypatch.setattr(RunAdmin, "ledger_part", racing)
    text = client.get(reverse(page, args=[run.pk])).content.decode()

    # The page as of its first read: pending, its two rows unresolved, Clean up now offered.
    assert "pending" in text and "complete" not in text.split('id="rows"')[0].split("Cleanup status")[-1]
    assert "2 unresolved" in text
    assert 'id="clean-up-now"' in text
    # The next read sees the pass whole.
    monkeypatch.setattr(RunAdmin, "ledger_part", read_rows)
    after = client.get(reverse(page, args=[run.pk])).content.decode()
    assert "unresolved" not in after.split('id="rows"')[1].split("</h2>")[0]
    assert 'id="clean-up-now"' not in after
