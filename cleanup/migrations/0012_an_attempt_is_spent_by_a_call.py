"""An attempt is spent by a call, not by a claim: a row says whether its claim's call started.

A claim taken over from a sweeper that died before calling gives that attempt back.
Existing rows start with false, which is what a claim without a call says; a constant
default rewrites no table on PostgreSQL 11 and later.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0011_backends'),
    ]

    operations = [
        migrations.AddField(
            model_name='resource',
            name='claim_called',
            field=models.BooleanField(default=False, editable=False),
        ),
    ]
