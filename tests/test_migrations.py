"""The migrations match the models, and the database keeps the attempt counter in bounds."""

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from cleanup.conf import ATTEMPTS_CEILING
from cleanup.models import Resource
from tests.fakes import make_run


@pytest.mark.django_db
def test_the_migrations_are_up_to_date():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_the_database_refuses_an_attempt_count_beyond_the_ceiling():
    run = make_run()
    row = Resource.objects.create(run=run, module="m", kind="creature", ref="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Resource.objects.filter(pk=row.pk).update(revert_attempts=ATTEMPTS_CEILING + 1)
    Resource.objects.filter(pk=row.pk).update(revert_attempts=ATTEMPTS_CEILING)


@pytest.mark.django_db
def test_the_ledger_is_vacuumed_after_one_percent_of_its_rows_changed():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname IN ('cleanup_resource', 'cleanup_run')")
        options = dict(cursor.fetchall())
    for table in ("cleanup_resource", "cleanup_run"):
        assert "autovacuum_vacuum_scale_factor=0.01" in options[table], options
