"""A run a person ended keeping its rows (rule 7) reads ``left`` ("left for later"), not
``incomplete``: it was never given up on. The runs already so are moved over."""

from django.db import migrations, models

STATUSES = [
    ("not_required", "not required"),
    ("pending", "pending"),
    ("complete", "complete"),
    ("incomplete", "incomplete"),
    ("left", "left for later"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup", "0028_the_feed_notifies_its_listeners"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="cleanup_status",
            field=models.CharField(choices=STATUSES, default="not_required", max_length=16),
        ),
        migrations.RunSQL(
            "UPDATE cleanup_run SET cleanup_status = 'left' WHERE NOT auto_cleanup AND cleanup_status = 'incomplete'",
            "UPDATE cleanup_run SET cleanup_status = 'incomplete' WHERE cleanup_status = 'left'",
        ),
    ]
