"""The table of the counters every process of the site shares when there is no Redis: the
API's throttles, the failed-token lockout, the error mail's bound (Django's database cache,
``LOCATION`` ``cleanup_counters``; its columns are those ``createcachetable`` makes, so that
``migrate`` alone makes a site ready, and ``createcachetable`` finds it made)."""

from django.db import migrations

TABLE = "cleanup_counters"


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup", "0030_a_cleanup_that_completes_logs_it"),
    ]

    operations = [
        migrations.RunSQL(
            [
                f'CREATE TABLE IF NOT EXISTS "{TABLE}" ('
                '"cache_key" varchar(255) NOT NULL PRIMARY KEY, '
                '"value" text NOT NULL, '
                '"expires" timestamp with time zone NOT NULL)',
                f'CREATE INDEX IF NOT EXISTS "{TABLE}_expires" ON "{TABLE}" ("expires")',
            ],
            f'DROP TABLE IF EXISTS "{TABLE}"',
        ),
    ]
