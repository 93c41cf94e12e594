"""A person's mark-down holds: a flag, an optional end, and what the last probe saw meanwhile.

New columns with constant defaults; nothing existing changes.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0012_an_attempt_is_spent_by_a_call'),
    ]

    operations = [
        migrations.AddField(
            model_name='modulehealth',
            name='held',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='modulehealth',
            name='held_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='modulehealth',
            name='last_probe',
            field=models.CharField(blank=True, default='', max_length=500),
        ),
        migrations.AddField(
            model_name='modulehealth',
            name='last_probe_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
