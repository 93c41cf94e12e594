"""The change feed: a place for each run log and modules' log entry, and the feed's counter.

The entries already written are placed at once, the run log's first (its ids as they
are), then the modules' log after the run log's highest id; new entries get theirs once
committed (`cleanup.feed.stamp`).
"""

from django.db import migrations, models
from django.db.models import F, Max


def place_existing(apps, schema_editor):
    RunLog = apps.get_model("cleanup", "RunLog")
    ModuleEvent = apps.get_model("cleanup", "ModuleEvent")
    FeedSequence = apps.get_model("cleanup", "FeedSequence")
    highest_log = RunLog.objects.aggregate(m=Max("id"))["m"] or 0
    RunLog.objects.update(seq=F("id"))
    ModuleEvent.objects.update(seq=F("id") + highest_log)
    highest_event = ModuleEvent.objects.aggregate(m=Max("seq"))["m"] or 0
    FeedSequence.objects.create(pk=1, last=max(highest_log, highest_event))


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0014_idempotency_keys_and_who_started_a_run'),
    ]

    operations = [
        migrations.CreateModel(
            name='FeedSequence',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('last', models.BigIntegerField(default=0)),
            ],
        ),
        migrations.AddField(
            model_name='moduleevent',
            name='seq',
            field=models.BigIntegerField(blank=True, editable=False, null=True, unique=True),
        ),
        migrations.AddField(
            model_name='runlog',
            name='seq',
            field=models.BigIntegerField(blank=True, editable=False, null=True, unique=True),
        ),
        migrations.AddIndex(
            model_name='moduleevent',
            index=models.Index(condition=models.Q(('seq__isnull', True)), fields=['id'], name='module_event_unfed_idx'),
        ),
        migrations.AddIndex(
            model_name='runlog',
            index=models.Index(condition=models.Q(('seq__isnull', True)), fields=['id'], name='runlog_unfed_idx'),
        ),
        migrations.RunPython(place_existing, migrations.RunPython.noop),
    ]
