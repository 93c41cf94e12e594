from django.db import migrations, models

# On PostgreSQL the runs table keeps its own tally (cleanup.tally, models.RunTally): every
# statement that inserts or deletes runs appends one change per status pair it touched,
# every run moved to another status or cleanup status appends two, and a TRUNCATE empties
# the tally with the runs. Made with the runs locked (CREATE TRIGGER takes a lock that
# writers wait on until this migration commits), then seeded from the runs as they are.
TRIGGERS = """
CREATE FUNCTION cleanup_run_tally_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cleanup_runtally (status, cleanup_status, delta)
    SELECT status, cleanup_status, count(*) FROM tally_added GROUP BY status, cleanup_status;
    RETURN NULL;
END $$;
CREATE FUNCTION cleanup_run_tally_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cleanup_runtally (status, cleanup_status, delta)
    SELECT status, cleanup_status, -count(*) FROM tally_removed GROUP BY status, cleanup_status;
    RETURN NULL;
END $$;
CREATE FUNCTION cleanup_run_tally_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cleanup_runtally (status, cleanup_status, delta)
    VALUES (OLD.status, OLD.cleanup_status, -1), (NEW.status, NEW.cleanup_status, 1);
    RETURN NULL;
END $$;
CREATE FUNCTION cleanup_run_tally_emptied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM cleanup_runtally;
    RETURN NULL;
END $$;
CREATE TRIGGER cleanup_run_tally_added AFTER INSERT ON cleanup_run
    REFERENCING NEW TABLE AS tally_added FOR EACH STATEMENT EXECUTE FUNCTION cleanup_run_tally_added();
CREATE TRIGGER cleanup_run_tally_removed AFTER DELETE ON cleanup_run
    REFERENCING OLD TABLE AS tally_removed FOR EACH STATEMENT EXECUTE FUNCTION cleanup_run_tally_removed();
CREATE TRIGGER cleanup_run_tally_moved AFTER UPDATE OF status, cleanup_status ON cleanup_run
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.cleanup_status IS DISTINCT FROM NEW.cleanup_status)
    EXECUTE FUNCTION cleanup_run_tally_moved();
CREATE TRIGGER cleanup_run_tally_emptied AFTER TRUNCATE ON cleanup_run
    FOR EACH STATEMENT EXECUTE FUNCTION cleanup_run_tally_emptied();
INSERT INTO cleanup_runtally (status, cleanup_status, delta)
    SELECT status, cleanup_status, count(*) FROM cleanup_run GROUP BY status, cleanup_status;
"""
DROP = """
DROP TRIGGER IF EXISTS cleanup_run_tally_added ON cleanup_run;
DROP TRIGGER IF EXISTS cleanup_run_tally_removed ON cleanup_run;
DROP TRIGGER IF EXISTS cleanup_run_tally_moved ON cleanup_run;
DROP TRIGGER IF EXISTS cleanup_run_tally_emptied ON cleanup_run;
DROP FUNCTION IF EXISTS cleanup_run_tally_added();
DROP FUNCTION IF EXISTS cleanup_run_tally_removed();
DROP FUNCTION IF EXISTS cleanup_run_tally_moved();
DROP FUNCTION IF EXISTS cleanup_run_tally_emptied();
"""


def on_postgresql(sql):
    def run(apps, schema_editor):
        schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup", "0020_counters_for_the_metrics"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunTally",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("status", models.CharField(max_length=16)),
                ("cleanup_status", models.CharField(max_length=16)),
                ("delta", models.BigIntegerField()),
            ],
            options={
                "ordering": ["id"],
            },
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=models.Q(("auto_cleanup", False)), fields=["id"], name="run_by_hand_idx"),
        ),
        migrations.RunPython(on_postgresql(TRIGGERS), on_postgresql(DROP)),
    ]
