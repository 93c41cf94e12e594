"""A module may serve several backends: steps, ledger rows, module health and its log say which.

Every existing row takes the backend "" (the module's only one), so a module with one backend
behaves as before. Module health becomes one row per (module, backend), and keeps the boot
id its backend last answered with. Adding a column with a constant default rewrites no
table on PostgreSQL 11 and later.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0010_choices_for_outcomes_and_log_kinds'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='modulehealth',
            options={'ordering': ['module', 'backend'], 'verbose_name_plural': 'module health'},
        ),
        migrations.AddField(
            model_name='moduleevent',
            name='backend',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddField(
            model_name='modulehealth',
            name='backend',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddField(
            model_name='modulehealth',
            name='boot_id',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='modulehealth',
            name='watched_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='resource',
            name='backend',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddField(
            model_name='step',
            name='backend',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AlterField(
            model_name='modulehealth',
            name='module',
            field=models.CharField(max_length=100),
        ),
        migrations.AddConstraint(
            model_name='modulehealth',
            constraint=models.UniqueConstraint(fields=('module', 'backend'), name='modulehealth_module_backend_uniq'),
        ),
    ]
