"""Attempt outcomes, run log kinds and module event kinds name their choices.

Choices live in Python only: the columns and their contents do not change, so this is
reversible and costs nothing on a large ledger.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0009_ledger_autovacuum'),
    ]

    operations = [
        migrations.AlterField(
            model_name='attempt',
            name='outcome',
            field=models.CharField(choices=[('done', 'done'), ('failed', 'failed'), ('drifted', 'drifted'), ('retry', 'retry'), ('terminal', 'terminal'), ('expired', 'expired'), ('waited', 'waited'), ('unavailable', 'unavailable')], max_length=16),
        ),
        migrations.AlterField(
            model_name='moduleevent',
            name='kind',
            field=models.CharField(choices=[('module.down', 'module.down'), ('module.up', 'module.up'), ('module.gave_up', 'module.gave_up')], max_length=32),
        ),
        migrations.AlterField(
            model_name='runlog',
            name='kind',
            field=models.CharField(choices=[('run.started', 'run.started'), ('run.completed', 'run.completed'), ('run.cancelled', 'run.cancelled'), ('run.aborted', 'run.aborted'), ('step.performed', 'step.performed'), ('step.failed', 'step.failed'), ('step.waiting', 'step.waiting'), ('cleanup.retry', 'cleanup.retry'), ('cleanup.swept', 'cleanup.swept'), ('cleanup.reverted', 'cleanup.reverted'), ('cleanup.failed', 'cleanup.failed'), ('cleanup.gave_up', 'cleanup.gave_up'), ('cleanup.recovered', 'cleanup.recovered'), ('resource.orphaned', 'resource.orphaned'), ('resource.waived', 'resource.waived'), ('resource.resurrected', 'resource.resurrected')], max_length=64),
        ),
    ]
