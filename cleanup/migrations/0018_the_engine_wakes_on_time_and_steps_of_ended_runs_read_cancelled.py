"""The engine's wake-up row, and `cancelled` for the steps of a run that ended before them.

A new table of one row (`cleanup.wakeup`). The steps of runs already cancelled or aborted
that never finished (`pending`, or `running` like a wait the cancel cut short) read
`cancelled` from now on; nothing else changes.
"""

from django.db import migrations, models


def cancel_unfinished_steps(apps, schema_editor):
    Step = apps.get_model("cleanup", "Step")
    Step.objects.filter(run__status__in=["cancelled", "aborted"], status__in=["pending", "running"]).update(
        status="cancelled"
    )


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0013_a_persons_mark_down_holds'),
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
        migrations.RunPython(cancel_unfinished_steps, migrations.RunPython.noop),
    ]
