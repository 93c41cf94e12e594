"""Stable pages: cursors on a total order, walked exactly once while the list changes; conditional reads."""

from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from cleanup.models import Resource, Run, RunStatus
from tests.fakes import make_rows, make_run, make_step
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return api_as("view_run", "change_run", "cleanup_run", "view_resource", "view_runlog")


def walk(api, url, between=None):
    """Every page of a list, following `next`; ``between(n)`` runs before page n+1 is read."""
    seen, pages = [], 0
    while url:
        answer = api.get(url)
        assert answer.status_code == 200, answer.json()
        body = answer.json()
        seen += [r["id"] for r in body["results"]]
        pages += 1
        url = body["next"]
        if url:
            assert f'<{url}>; rel="next"' in answer["Link"]
        if between and url:
            between(pages)
        assert pages < 100
    return seen


def test_a_walk_over_runs_while_runs_are_created_shows_each_once(api):
    existing = [make_run(name=f"run {n}").pk for n in range(10)]
    created = []

    def more(_page):  # new runs land at the head of a newest-first list
        created.extend(make_run(name="new").pk for _ in range(2))

    seen = walk(api, f"{API}runs/?page_size=3", more)
    assert len(seen) == len(set(seen)), "no run on two pages"
    assert [pk for pk in seen if pk in existing] == sorted(existing, reverse=True), "none skipped, in order"
    assert created and not set(created) & set(seen), "runs created behind the walk are not pulled into it"


def test_a_walk_over_the_ledger_while_rows_are_created_and_resolved_shows_each_once(api):
    run = make_run(status=RunStatus.ABORTED)
    step = make_step(run)
    rows = [r.pk for r in make_rows(step, [f"orc-{n}" for n in range(12)], placeholder=False)]
    resolved = iter(rows[::-1])

    def change(_page):
        # Resolve a row not reached yet and make a new one, as a sweeper and a step would.
        Resource.objects.filter(pk=next(resolved)).update(state="reverted", updated_at=timezone.now())
        make_rows(step, [f"late-{_page}"], placeholder=False)

    seen = walk(api, f"{API}resources/?page_size=4", change)
    assert len(seen) == len(set(seen))
    assert [pk for pk in seen if pk in rows] == rows, "every row that existed is shown once, resolved or not"


def test_a_walk_over_live_rows_while_rows_are_resolved_neither_fails_nor_repeats(api):
    run = make_run(status=RunStatus.ABORTED)
    rows = [r.pk for r in make_rows(make_step(run), [f"orc-{n}" for n in range(12)], placeholder=False)]

    def resolve_seen(page):  # rows already read leave the filter: the next page must not shift
        Resource.objects.filter(pk__in=rows[: page * 4]).update(state="reverted", updated_at=timezone.now())

    seen = walk(api, f"{API}resources/?state=live&page_size=4", resolve_seen)
    assert seen == rows


def test_previous_goes_back_to_the_page_before(api):
    pks = sorted((make_run(name=f"r{n}").pk for n in range(7)), reverse=True)
    first = api.get(f"{API}runs/", {"page_size": 3}).json()
    second = api.get(first["next"]).json()
    third = api.get(second["next"]).json()
    assert [r["id"] for r in third["results"]] == pks[6:] and third["next"] is None
    back = api.get(third["previous"]).json()
    assert [r["id"] for r in back["results"]] == pks[3:6]
    assert [r["id"] for r in api.get(back["previous"]).json()["results"]] == pks[:3]


@pytest.mark.parametrize(
    "query, field",
    [
        ({"page_size": "501"}, "page_size"),
        ({"page_size": "20000"}, "page_size"),
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "ten"}, "page_size"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"ordering": "name"}, "ordering"),
        ({"updated_since": "yesterday"}, "updated_since"),
        ({"updated_since": "2026-12-01T18:00:00"}, "updated_since"),  # no zone
        ({"updated_since": "2026-13-01T18:00:00Z"}, "updated_since"),
    ],
)
def test_a_bad_page_or_order_is_refused_naming_it(api, query, field):
    make_run()
    answer = api.get(f"{API}runs/", query)
    assert answer.status_code == 400
    assert field in str(answer.json())


def test_a_cursor_of_one_order_is_refused_under_another(api):
    for _ in range(3):
        make_run()
    by_update = api.get(f"{API}runs/", {"ordering": "updated_at", "page_size": 1}).json()["next"]
    cursor = parse_qs(urlsplit(by_update).query)["cursor"][0]
    answer = api.get(f"{API}runs/", {"cursor": cursor})
    assert answer.status_code == 400 and "cursor" in str(answer.json())


def test_page_size_500_and_any_offset_the_database_cannot_store_are_allowed(api):
    make_run()
    assert api.get(f"{API}runs/", {"page_size": "500"}).status_code == 200
    # PostgreSQL refuses an offset of -22:38; the time is read in UTC.
    answer = api.get(f"{API}runs/", {"updated_since": "0503-02-21T14:58:54-22:38"})
    assert answer.status_code == 200 and len(answer.json()["results"]) == 1


def test_runs_and_rows_changed_since_a_time_ordered_by_their_change(api):
    long_ago = timezone.now() - timedelta(hours=1)
    old, touched, fresh = (make_run(name=n) for n in ("old", "touched", "fresh"))
    Run.objects.filter(pk__in=[old.pk, touched.pk, fresh.pk]).update(updated_at=long_ago)
    since = timezone.now() - timedelta(minutes=1)
    Run.objects.filter(pk=fresh.pk).update(updated_at=timezone.now() - timedelta(seconds=5))
    Run.objects.filter(pk=touched.pk).update(updated_at=timezone.now())
    body = api.get(f"{API}runs/", {"updated_since": since.isoformat(), "ordering": "-updated_at"}).json()
    assert [r["name"] for r in body["results"]] == ["touched", "fresh"]
    walked = walk(api, f"{API}runs/?ordering=updated_at&page_size=1")
    assert walked == [old.pk, fresh.pk, touched.pk]

    rows = make_rows(make_step(old), ["a", "b"], placeholder=False)
    Resource.objects.update(updated_at=long_ago)
    Resource.objects.filter(pk=rows[1].pk).update(state="reverted", updated_at=timezone.now())
    listed = api.get(f"{API}resources/", {"updated_since": since.isoformat()}).json()["results"]
    assert [r["id"] for r in listed] == [rows[1].pk]
    ordered = api.get(f"{API}runs/{old.pk}/resources/", {"ordering": "-id"}).json()["results"]
    assert [r["id"] for r in ordered] == [rows[1].pk, rows[0].pk]


def test_a_ties_in_the_order_are_walked_by_id(api):
    at = timezone.now()
    pks = [make_run(name=f"r{n}").pk for n in range(5)]
    Run.objects.update(updated_at=at)
    assert walk(api, f"{API}runs/?ordering=updated_at&page_size=2") == pks
    assert walk(api, f"{API}runs/?ordering=-updated_at&page_size=2") == pks[::-1]


# -- conditional reads ------------------------------------------------------------------


def test_a_run_answers_an_etag_and_304_while_it_is_current(api):
    run = make_run(status=RunStatus.RUNNING, name="raid")
    first = api.get(f"{API}runs/{run.pk}/")
    tag = first["ETag"]
    assert tag.startswith('"')
    same = api.get(f"{API}runs/{run.pk}/", HTTP_IF_NONE_MATCH=tag)
    assert (same.status_code, same.content, same["ETag"]) == (304, b"", tag)
    assert api.get(f"{API}runs/{run.pk}/", HTTP_IF_NONE_MATCH=f'"other", W/{tag}').status_code == 304
    assert api.post(f"{API}runs/{run.pk}/cancel/", {"cleanup": False}, format="json").status_code == 200
    changed = api.get(f"{API}runs/{run.pk}/", HTTP_IF_NONE_MATCH=tag)
    assert changed.status_code == 200 and changed["ETag"] != tag
    assert changed.json()["status"] == "cancelled"


def test_a_ledger_row_answers_an_etag_that_changes_when_it_is_waived(api):
    run = make_run(status=RunStatus.ABORTED)
    [row] = make_rows(make_step(run), ["orc-1"], placeholder=False)
    tag = api.get(f"{API}resources/{row.pk}/")["ETag"]
    assert api.get(f"{API}resources/{row.pk}/", HTTP_IF_NONE_MATCH=tag).status_code == 304
    assert api.post(f"{API}resources/{row.pk}/waive/", {"reason": "gone"}, format="json").status_code == 200
    assert api.get(f"{API}resources/{row.pk}/", HTTP_IF_NONE_MATCH=tag).status_code == 200


# -- the cleanup plan -------------------------------------------------------------------


def test_the_cleanup_plan_is_paged_by_group_and_walked_once_while_rows_are_resolved(api):
    from cleanup.plan import cleanup_plan
    from tests.fakes import make_lease_row

    run = make_run(status=RunStatus.ABORTED)
    make_lease_row(run, baseline=1, applied=3)
    steps = [make_step(run) for _ in range(4)]
    for n, step in enumerate(steps):
        make_rows(step, [f"orc-{n}-a", f"orc-{n}-b"], placeholder=False)
    whole = cleanup_plan(run)
    assert len(whole) == 5
    first = api.get(f"{API}runs/{run.pk}/cleanup-plan/", {"page_size": 2})
    assert first.status_code == 200 and 'rel="next"' in first["Link"]
    body = first.json()
    groups = body["groups"]
    assert body["previous"] is None and len(groups) == 2
    # A group already read is given back, and one not reached yet loses one of its two rows.
    Resource.objects.filter(ref__startswith="orc-0-").update(state="reverted")
    Resource.objects.filter(ref="orc-3-a").update(state="reverted")
    url = body["next"]
    while url:
        body = api.get(url).json()
        groups += body["groups"]
        url = body["next"]
    refs = [[r["ref"] for r in g["rows"]] for g in groups]
    assert refs == [[r["ref"] for r in g["rows"]] for g in whole[:4]] + [["orc-3-b"]]
    assert api.get(f"{API}runs/{run.pk}/cleanup-plan/", {"page_size": "501"}).status_code == 400
    assert api.get(f"{API}runs/{run.pk}/cleanup-plan/", {"cursor": "x"}).status_code == 400
