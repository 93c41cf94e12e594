"""Stable pages: cursors on a total order, walked exactly once while the list changes; conditional reads."""

from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from cleanup.models import ModuleHealth, ModuleState, Resource, Run, RunStatus
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


def test_an_empty_cursor_is_refused_as_the_schema_says_telling_to_leave_it_out(api):
    run = make_run()
    for url in (f"{API}runs/?cursor=", f"{API}resources/?cursor=", f"{API}runs/{run.pk}/cleanup-plan/?cursor="):
        answer = api.get(url)
        assert answer.status_code == 400, url
        assert answer.json()["errors"] == {"cursor": ["empty: leave cursor out for the first page"]}


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


def test_a_list_page_answers_a_weak_etag_and_304_until_a_row_on_it_changes(api):
    run = make_run(status=RunStatus.ABORTED)
    rows = make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    url = f"{API}resources/?run={run.pk}"
    first = api.get(url)
    tag = first["ETag"]
    assert tag.startswith('W/"')
    make_run(status=RunStatus.RUNNING).log.create(kind="run.started", detail={})  # the feed moves on
    same = api.get(url, HTTP_IF_NONE_MATCH=tag)
    assert (same.status_code, same.content, same["ETag"]) == (304, b"", tag)
    # The copy held is current as of the feed's position now: follow the feed from there.
    assert same["X-Feed-Position"] == str(first.json()["position"])
    assert api.get(url + "&page_size=1", HTTP_IF_NONE_MATCH=tag).status_code == 200  # another page
    assert api.post(f"{API}resources/{rows[0].pk}/waive/", {"reason": "gone"}, format="json").status_code == 200
    changed = api.get(url, HTTP_IF_NONE_MATCH=tag)
    assert changed.status_code == 200 and changed["ETag"] != tag


def test_the_modules_list_answers_304_while_no_backend_changed():
    api = api_as("view_modulehealth")
    ModuleHealth.objects.create(module="test")
    tag = api.get(f"{API}modules/")["ETag"]
    assert api.get(f"{API}modules/", HTTP_IF_NONE_MATCH=tag).status_code == 304
    ModuleHealth.objects.filter(module="test").update(state=ModuleState.DOWN, last_error="the shard said 503")
    assert api.get(f"{API}modules/", HTTP_IF_NONE_MATCH=tag).status_code == 200


def test_a_write_with_a_stale_if_match_answers_412_and_changes_nothing(api):
    run = make_run(status=RunStatus.RUNNING, name="raid")
    tag = api.get(f"{API}runs/{run.pk}/")["ETag"]
    Run.objects.filter(pk=run.pk).update(name="raid, renamed")  # someone else changed it since
    stale = api.post(f"{API}runs/{run.pk}/cancel/", {"cleanup": False}, format="json", HTTP_IF_MATCH=tag)
    assert stale.status_code == 412
    body = stale.json()
    assert body["code"] == "precondition_failed" and f"run {run.pk}" in body["detail"]
    assert stale["ETag"] == api.get(f"{API}runs/{run.pk}/")["ETag"] != tag
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    # A weak tag never matches an If-Match: the comparison is strong.
    weak = api.post(
        f"{API}runs/{run.pk}/cancel/", {"cleanup": False}, format="json", HTTP_IF_MATCH="W/" + stale["ETag"]
    )
    assert weak.status_code == 412


def test_a_write_with_the_current_if_match_proceeds(api):
    run = make_run(status=RunStatus.RUNNING, name="raid")
    tag = api.get(f"{API}runs/{run.pk}/")["ETag"]
    done = api.post(f"{API}runs/{run.pk}/cancel/", {"cleanup": False}, format="json", HTTP_IF_MATCH=f'"other", {tag}')
    assert done.status_code == 200 and done.json()["status"] == "cancelled"
    ended = make_run(status=RunStatus.ABORTED)
    [row, other] = make_rows(make_step(ended), ["orc-1", "orc-2"], placeholder=False)
    row_tag = api.get(f"{API}resources/{row.pk}/")["ETag"]
    waived = api.post(f"{API}resources/{row.pk}/waive/", {"reason": "gone"}, format="json", HTTP_IF_MATCH=row_tag)
    assert waived.status_code == 200 and waived.json()["state"] == "waived"
    again = api.post(f"{API}resources/{row.pk}/waive/", {"reason": "gone"}, format="json", HTTP_IF_MATCH=row_tag)
    assert again.status_code == 412  # the row changed: its tag is no longer the one sent
    run_tag = api.get(f"{API}runs/{ended.pk}/")["ETag"]
    body = {"reason": "gone", "rows": "all"}
    assert api.post(f"{API}runs/{ended.pk}/waive/", body, format="json", HTTP_IF_MATCH='"stale"').status_code == 412
    assert api.post(f"{API}runs/{ended.pk}/waive/", body, format="json", HTTP_IF_MATCH=run_tag).status_code == 200
    assert api.post(f"{API}runs/{ended.pk}/cleanup/", {}, format="json", HTTP_IF_MATCH=run_tag).status_code == 412
    assert api.post(f"{API}runs/{ended.pk}/cleanup/", {}, format="json", HTTP_IF_MATCH="*").status_code == 409
    assert Resource.objects.get(pk=other.pk).state == "waived"


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


# -- a walk by a time, and where the feed stood --------------------------------------------


def test_a_walk_by_updated_at_that_a_waiver_overtakes_is_refused_naming_the_exact_orders():
    """Newest change first, a row waived after the first page jumps ahead of the walk: it
    would never be listed, so following `next` is refused instead."""
    api = api_as("view_resource", "cleanup_run")
    run = make_run(status=RunStatus.ABORTED)
    rows = make_rows(make_step(run), [f"orc-{n}" for n in range(6)], placeholder=False)
    for n, row in enumerate(rows):  # distinct times, oldest first
        Resource.objects.filter(pk=row.pk).update(updated_at=timezone.now() - timedelta(minutes=10 - n))
    first = api.get(f"{API}resources/?ordering=-updated_at&page_size=2").json()
    read = {r["id"] for r in first["results"]}
    unread = next(row for row in rows if row.pk not in read)
    assert api.post(f"{API}resources/{unread.pk}/waive/", {"reason": "gone"}, format="json").status_code == 200
    refused = api.get(first["next"])
    assert refused.status_code == 409
    assert refused.json()["code"] == "walk_not_exact"
    assert "id or -id" in refused.json()["detail"]
    # By id the same walk is exact: the waived row is listed once.
    seen = walk(api, f"{API}resources/?ordering=id&page_size=2")
    assert sorted(seen) == sorted(row.pk for row in rows)


def test_a_walk_by_updated_at_with_nothing_changed_goes_on(api):
    run = make_run(status=RunStatus.ABORTED)
    rows = make_rows(make_step(run), [f"orc-{n}" for n in range(5)], placeholder=False)
    seen = walk(api, f"{API}resources/?ordering=-updated_at&page_size=2")
    assert sorted(seen) == sorted(row.pk for row in rows)


def test_a_list_says_where_the_feed_stood_before_it_was_read(api):
    from cleanup.feed import position
    from cleanup.models import RunLog

    run = make_run(status=RunStatus.RUNNING)
    RunLog.write(run.pk, "run.started")
    seen_before = position()  # placed: the list's position is at least this
    answer = api.get(f"{API}runs/")
    stood = answer.json()["position"]
    assert stood == int(answer["X-Feed-Position"]) >= seen_before
    RunLog.write(run.pk, "run.cancelled")
    after = api_as("view_runlog", "view_moduleevent", username="watcher").get(f"{API}changes/", {"after": stood})
    assert [e["kind"] for e in after.json()] == ["run.cancelled"], "what changed after the list is in the feed"
