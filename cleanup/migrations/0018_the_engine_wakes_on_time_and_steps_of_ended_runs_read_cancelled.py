"""The engine's wake-up row, `cancelled` for the steps of a run that ended before them, and
when staff were really told of a module's change.

A new table of one row (`cleanup.wakeup`). A module change's outbox rows name it, and the
change keeps when one of them was accepted (`told_at`), so "staff told" is said only then;
changes told before this keep their claim time in `alerted_at` and no `told_at`. A step
waiting for its backend says so in its own column (`waiting_since`), no longer in its
`last_error`. The steps of runs already cancelled or aborted
that never finished (`pending`, or `running` like a wait the cancel cut short) read
`cancelled` from now on; nothing else changes.
"""

import django.db.models.deletion
from django.db import migrations, models


def cancel_unfinished_steps(apps, schema_editor):
    Step = apps.get_model("cleanup", "Step")
    Step.objects.filter(run__status__in=["cancelled", "aborted"], status__in=["pending", "running"]).update(
        status="cancelled"
    )


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0016_api_tokens_are_stored_hashed'),
    ]

    operations = [
        migrations.CreateModel(
            name='Wake',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.AlterField(
            model_name='step',
            name='status',
            field=models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('done', 'done'), ('failed', 'failed'), ('cancelled', 'cancelled')], default='pending', max_length=16),
        ),
        migrations.AddField(
            model_name='moduleevent',
            name='told_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='alert',
            name='module_event',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='cleanup.moduleevent'),
        ),
        migrations.AddField(
            model_name='step',
            name='waiting_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(cancel_unfinished_steps, migrations.RunPython.noop),
    ]
