"""docs/settings.md agrees with the code: its engine table is what `cleanup.conf` writes, and
every setting the code reads or the site takes from the environment is in it. Imports `cleanup.conf`.
"""

import re

from django.conf import settings

from cleanup.conf import BY_NAME, SETTINGS, markdown_table

ROOT = settings.BASE_DIR
DOC = (ROOT / "docs" / "settings.md").read_text()
BEGIN = "<!-- The engine's settings: written by bin/settings-doc from cleanup/conf.py -->\n"
END = "<!-- end of the engine's settings -->\n"
# setting("X"), limit("X") and getattr(settings, "X", ...): the ways the engine reads a setting.
READ = re.compile(r"""(?:\b(?:setting|limit)\(\s*|getattr\(\s*settings\s*,\s*)["'](EVENT_\w+)["']""")


def engine_sources():
    return {path: path.read_text() for path in (ROOT / "cleanup").rglob("*.py")}


def test_the_documented_engine_table_is_the_one_cleanup_conf_writes():
    assert DOC.count(BEGIN) == 1 and DOC.count(END) == 1, "docs/settings.md lost its markers"
    written = DOC.split(BEGIN)[1].split(END)[0]
    assert written == markdown_table(), "docs/settings.md is out of date: run .venv/bin/python bin/settings-doc"


def test_every_setting_the_engine_reads_is_in_the_table_under_its_current_name():
    read = {name: path for path, text in engine_sources().items() for name in READ.findall(text)}
    assert {"EVENT_CLEANUP_RUN_BATCH", "EVENT_MAX_STEPS", "EVENT_SITE_URL", "EVENT_HEALTH_STALE_S"} <= set(read)
    current = {entry.name for entry in SETTINGS}
    assert {name: str(path) for name, path in read.items() if name not in current} == {}


def test_every_setting_in_the_table_is_read_by_the_engine():
    read = {name for text in engine_sources().values() for name in READ.findall(text)}
    assert [entry.name for entry in SETTINGS if entry.name not in read] == []


def test_every_engine_setting_the_code_names_is_documented():
    named = {name for text in engine_sources().values() for name in re.findall(r"\bEVENT_[A-Z_]+\b", text)}
    assert sorted(name for name in named if f"`{name}`" not in DOC) == []


def test_every_variable_the_site_reads_is_documented():
    site = (ROOT / "eventsite" / "settings.py").read_text()
    read = set(re.findall(r"""(?:env_\w+\(|os\.environ\.get\()\s*["'](\w+)["']""", site))
    assert {"DATABASE_URL", "SECRET_KEY", "REDIS_URL", "Q_POLL", "EMAIL_HOST", "SECURE_HSTS_SECONDS"} <= read
    assert sorted(name for name in read if f"`{name}`" not in DOC) == []
    assert sorted(name for name in BY_NAME if f"`{name}`" not in DOC) == []


def test_each_help_text_fits_in_a_table_cell():
    assert [entry.name for entry in SETTINGS if "|" in entry.help or "\n" in entry.help] == []
