"""The timeline tells the truth: a give-back at the very end is seen, outages are bands,
waivers are not give-backs, steps of one second are apart, and it is as wide as the page."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from cleanup import timeline
from cleanup.models import ModuleEvent, Resource, RunLog, RunStatus, Step
from tests.fakes import make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

PLOT = timeline.WIDTH - timeline.LEFT - timeline.RIGHT


def points(svg, curve):
    found = re.search(rf'<polyline class="curve" data-curve="{curve}"[^>]*points="([^"]+)"', svg)
    assert found, f"no {curve} curve"
    return [tuple(map(float, p.split(","))) for p in found[1].split()]


def ended_run(seconds=60, **fields):
    """A run that began ``seconds`` ago and ended now, with three wolves taken at its start."""
    now = timezone.now()
    began = now - timedelta(seconds=seconds)
    run = make_run(status=RunStatus.COMPLETED, name="wolf hunt", ended_at=now, **fields)
    type(run).objects.filter(pk=run.pk).update(created_at=began)
    run.refresh_from_db()
    rows = make_rows(make_step(run, finished_at=began), ["wolf-1", "wolf-2", "wolf-3"], placeholder=False)
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(created_at=began)
    return run, began, now


def test_a_give_back_at_the_very_end_is_drawn_on_past_the_completion_bar(monkeypatch):
    run, began, now = ended_run(cleanup_status="complete")
    Resource.objects.filter(run=run).update(state="reverted", resolved_at=now)
    RunLog.objects.create(run=run, kind="cleanup.recovered", at=now, detail={})
    svg = str(timeline.svg(run))

    given, taken = points(svg, "given back"), points(svg, "taken")
    top = min(y for _, y in taken)
    assert given[-1][1] == top, "the given-back curve does not reach what was taken"
    bar = re.search(r'<rect x="([\d.]+)" y="[\d.]+" width="4"[^>]*><title>cleanup complete', svg)
    bar_right = float(bar[1]) + 4
    at_top = [x for x, y in given if y == top]
    assert max(at_top) - bar_right >= 0.03 * PLOT, "the final level is hidden under the completion bar"
    assert svg.index('data-curve="given back"') > svg.index("cleanup complete at"), "drawn under the bar"
    assert svg.index('data-curve="given back"') > svg.index('data-curve="taken"'), "hidden under what was taken"
    assert "given back 3</text>" in svg and "taken 3</text>" in svg


def test_waivers_and_rows_gone_from_the_world_are_not_drawn_as_give_backs():
    run, began, now = ended_run(cleanup_status="complete")
    wolves = list(Resource.objects.filter(run=run).order_by("id"))
    halfway = began + timedelta(seconds=30)
    Resource.objects.filter(pk=wolves[0].pk).update(state="reverted", resolved_at=halfway)
    Resource.objects.filter(pk=wolves[1].pk).update(state="waived", resolved_at=halfway, waived_reason="tamed")
    Resource.objects.filter(pk=wolves[2].pk).update(state="orphaned", resolved_at=halfway)
    svg = str(timeline.svg(run))
    assert "given back 1</text>" in svg and "waived 1</text>" in svg and "gone from the world 1</text>" in svg
    assert "given back: 1</title>" in svg and "waived: 1</title>" in svg


def test_an_outage_of_a_backend_the_run_used_is_a_band_from_down_to_up():
    run, began, now = ended_run()
    Resource.objects.filter(run=run).update(backend="south")
    down, up = began + timedelta(seconds=10), began + timedelta(seconds=40)
    ModuleEvent.objects.create(
        module="test", backend="south", kind="module.down", at=down, detail={"error": "connection refused"}
    )
    ModuleEvent.objects.create(module="test", backend="south", kind="module.up", at=up, detail={})
    # Another backend's outage holds none of this run's work: not drawn.
    ModuleEvent.objects.create(module="test", backend="north", kind="module.down", at=down, detail={})
    svg = str(timeline.svg(run))

    bands = re.findall(r'<rect class="outage" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*><title>([^<]*)', svg)
    assert len(bands) == 1, bands
    left, width, title = float(bands[0][0]), float(bands[0][1]), bands[0][2]
    shown = 60 * (1 + timeline.TAIL)
    assert left == pytest.approx(timeline.LEFT + PLOT * 10 / shown, abs=2)
    assert width == pytest.approx(PLOT * 30 / shown, abs=2)
    assert title.startswith("test/south down from ") and " to " in title and "connection refused" in title
    assert "test/north" not in svg


def test_an_outage_still_on_reaches_the_right_edge():
    run, began, now = ended_run()
    ModuleEvent.objects.create(
        module="test", kind="module.down", at=began - timedelta(seconds=5), detail={"error": "marked down by alice"}
    )
    svg = str(timeline.svg(run))
    band = re.search(r'<rect class="outage" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*><title>([^<]*)', svg)
    assert float(band[1]) == pytest.approx(timeline.LEFT, abs=0.5), "an outage from before the run starts at its left"
    assert float(band[1]) + float(band[2]) == pytest.approx(timeline.WIDTH - timeline.RIGHT, abs=0.5)
    assert "still down" in band[3]


def test_steps_that_ended_in_the_same_second_are_each_drawn_apart():
    run, began, now = ended_run()
    same = began + timedelta(seconds=20)
    for position in range(1, 6):
        make_step(run, position=position, finished_at=same + timedelta(milliseconds=position))
    svg = str(timeline.svg(run))
    dots = [(float(cx), float(cy)) for cx, cy in re.findall(r'<circle class="step" cx="([\d.]+)" cy="([\d.]+)"', svg)]
    assert len(dots) == Step.objects.filter(run=run).count() == 6
    for i, a in enumerate(dots):
        for b in dots[i + 1 :]:
            assert max(abs(a[0] - b[0]), abs(a[1] - b[1])) >= 2 * timeline.DOT, (
                f"steps drawn on top of each other: {a} {b}"
            )
    assert len(set(re.findall(r"<title>step (\d+) ", svg))) == 6


def test_the_picture_scales_to_the_page_width():
    run, _, _ = ended_run()
    head = re.match(r"<svg[^>]*>", str(timeline.svg(run)))[0]
    assert f'viewBox="0 0 {timeline.WIDTH} {timeline.HEIGHT}"' in head
    assert 'width="100%"' in head and "height=" not in head


def test_a_cleanup_that_completed_is_one_bar_and_an_earlier_recovery_keeps_its_own():
    run, began, now = ended_run(cleanup_status="complete")
    Resource.objects.filter(run=run).update(state="reverted", resolved_at=now)
    RunLog.objects.create(run=run, kind="cleanup.recovered", at=now, detail={})
    svg = str(timeline.svg(run))
    assert svg.count("<title>cleanup complete") == 1 and "cleanup completed at" not in svg

    # Recovered once, gave up again, then completed: the first recovery is its own bar.
    earlier = began + timedelta(seconds=20)
    RunLog.objects.create(run=run, kind="cleanup.recovered", at=earlier, detail={})
    RunLog.objects.filter(run=run, at=now).delete()
    RunLog.objects.create(run=run, kind="cleanup.gave_up", at=earlier + timedelta(seconds=5), detail={})
    RunLog.objects.create(run=run, kind="cleanup.recovered", at=now, detail={})
    svg = str(timeline.svg(run))
    assert svg.count("<title>cleanup complete at") == 1
    assert svg.count("<title>cleanup completed at") == 1 and "cleanup gave up at" in svg


def test_a_failed_attempt_of_a_step_that_then_succeeded_is_drawn():
    run, began, now = ended_run()
    RunLog.objects.create(
        run=run, kind="step.failed", at=began + timedelta(seconds=5), detail={"error": "the shard said 503"}
    )
    svg = timeline.svg(run)
    mark = re.search(r'<path class="step-failed"[^>]*><title>([^<]+)</title>', svg)
    assert mark and "step attempt failed at" in mark[1] and "the shard said 503" in mark[1]


def test_what_a_step_took_just_before_the_run_ended_is_drawn_before_the_end():
    # The run's last take lands 0.3 s before its end, between two of the curve's slices;
    # its give-back goes on for a minute after the end.
    run, began, now = ended_run(seconds=120)
    ended = now - timedelta(seconds=59.5)
    type(run).objects.filter(pk=run.pk).update(ended_at=ended)
    run.refresh_from_db()
    last = make_step(run, finished_at=ended - timedelta(seconds=0.3))
    late = make_rows(last, ["wolf-4"], placeholder=False)
    Resource.objects.filter(pk=late[0].pk).update(created_at=ended - timedelta(seconds=0.3))
    Resource.objects.filter(run=run).update(state="reverted", resolved_at=now)
    RunLog.objects.create(run=run, kind="run.completed", at=ended, detail={})
    svg = timeline.svg(run)
    end = float(re.search(r'<line x1="([\d.]+)"[^>]*><title>run completed at', svg)[1])
    taken = points(svg, "taken")
    top = min(y for _, y in taken)
    first_at_top = min(x for x, y in taken if y == top)
    assert first_at_top < end, "the last take is drawn after the run's end"
