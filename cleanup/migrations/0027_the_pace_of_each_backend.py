"""The shared schedule of calls per module and backend (`cleanup.pacing`), when no Redis."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("cleanup", "0026_backends_keep_a_dead_mans_switch")]

    operations = [
        migrations.RunSQL(
            "CREATE TABLE cleanup_pace (key text PRIMARY KEY, tat double precision NOT NULL)",
            reverse_sql="DROP TABLE cleanup_pace",
        )
    ]
