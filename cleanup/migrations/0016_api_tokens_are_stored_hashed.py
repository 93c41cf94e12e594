"""DRF's plain-text tokens (``authtoken_token``, left by the app the site no longer installs)
become knox tokens: the same key keeps working, now stored as its digest, and expires
EVENT_TOKEN_TTL_DAYS after this migration; the plain-text rows are deleted. May import: knox."""

from datetime import timedelta

from django.db import migrations
from django.utils import timezone

OLD_TABLE = "authtoken_token"


def hash_old_tokens(apps, schema_editor):
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS

    from cleanup.conf import setting

    connection = schema_editor.connection
    if OLD_TABLE not in connection.introspection.table_names():
        return
    AuthToken = apps.get_model("knox", "AuthToken")
    expiry = timezone.now() + timedelta(days=setting("EVENT_TOKEN_TTL_DAYS"))
    quoted = connection.ops.quote_name(OLD_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id FROM {quoted}")
        rows = cursor.fetchall()
        AuthToken.objects.bulk_create(
            AuthToken(digest=hash_token(key), token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH], user_id=user_id, expiry=expiry)
            for key, user_id in rows
        )
        cursor.execute(f"DELETE FROM {quoted}")


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup", "0015_the_change_feed"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    operations = [migrations.RunPython(hash_old_tokens, migrations.RunPython.noop, elidable=True)]
