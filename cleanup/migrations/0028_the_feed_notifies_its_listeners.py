from django.db import migrations

# Each statement that writes to the run log or the modules' log tells the feed's listeners
# (`cleanup.api.waiting`) on commit: PostgreSQL delivers one notification per channel and
# payload per transaction, however many rows it wrote.
NOTIFY = """
CREATE OR REPLACE FUNCTION cleanup_feed_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('cleanup_feed', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER cleanup_runlog_notify AFTER INSERT ON cleanup_runlog
    FOR EACH STATEMENT EXECUTE FUNCTION cleanup_feed_notify();
CREATE TRIGGER cleanup_moduleevent_notify AFTER INSERT ON cleanup_moduleevent
    FOR EACH STATEMENT EXECUTE FUNCTION cleanup_feed_notify();
"""

SILENT = """
DROP TRIGGER IF EXISTS cleanup_runlog_notify ON cleanup_runlog;
DROP TRIGGER IF EXISTS cleanup_moduleevent_notify ON cleanup_moduleevent;
DROP FUNCTION IF EXISTS cleanup_feed_notify();
"""


class Migration(migrations.Migration):
    dependencies = [("cleanup", "0027_the_pace_of_each_backend")]

    operations = [migrations.RunSQL(NOTIFY, SILENT)]
