"""The ledger is a hot table: vacuum it after 1% of its rows changed, not PostgreSQL's 20%.

Every verdict leaves behind the row version it replaced, and its entries in the partial
indexes the sweep reads (the finder's skip scan of ``finder_owing_run_idx`` first). Until
a vacuum removes them, each scan steps over them. On a ledger of millions of resolved
rows the default would wait for hundreds of thousands of changes; a big night makes tens
of thousands.
"""

from django.db import migrations

TABLES = ("cleanup_resource", "cleanup_run")
SETTINGS = "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, " \
           "autovacuum_analyze_scale_factor = 0.02"
RESET = "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor"


def tune(apps, schema_editor):
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET ({SETTINGS})")


def untune(apps, schema_editor):
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} RESET ({RESET})")


class Migration(migrations.Migration):
    dependencies = [("cleanup", "0008_run_cleanup_pending_idx")]

    operations = [migrations.RunPython(tune, untune, elidable=False)]
