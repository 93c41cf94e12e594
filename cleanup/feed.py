"""Where the change feed stands now: `position()`, the id its next entry will come after.

A stand-in until the feed itself (issue 19, item 5) gives its one sequence: the highest id of
the run log, which every action a person asks for writes to. An answer that queues work
(202) carries it as ``"after"``: what the work does is written after that position.
May import: the models only.
"""

from django.db.models import Max

from .models import RunLog


def position():
    """The highest id the feed has handed out so far (0 when it is empty)."""
    return RunLog.objects.aggregate(last=Max("id"))["last"] or 0
