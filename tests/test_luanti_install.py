"""The Luanti module without a server: installing the mod, LUANTI_WORLDS, a server that is not running."""

import os
import time

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from cleanup import registry
from eventsite.luanti import install, mailbox, worlds
from eventsite.luanti.module import SPAWN, SPAWN_RATE, TIME_SPEED


def test_the_app_registers_the_action_and_the_leases():
    assert registry.get_action("luanti.spawn") is SPAWN
    assert registry.get_lease("luanti.time_speed") is TIME_SPEED
    assert registry.get_lease("luanti.spawn_rate") is SPAWN_RATE


def test_the_command_installs_the_mod_and_enables_it_once(tmp_path, capsys):
    (tmp_path / "world.mt").write_text("gameid = minetest\nbackend = sqlite3\n")
    call_command("luanti_install_mod", str(tmp_path))
    out = capsys.readouterr().out
    assert "copied the mod" in out and "enabled the mod" in out
    assert (tmp_path / "worldmods" / "eventsite" / "init.lua").read_text() == (install.SOURCE / "init.lua").read_text()
    assert (tmp_path / "world.mt").read_text() == "gameid = minetest\nbackend = sqlite3\nload_mod_eventsite = true\n"

    call_command("luanti_install_mod", str(tmp_path))
    assert "already installed" in capsys.readouterr().out
    assert (tmp_path / "world.mt").read_text().count("load_mod_eventsite") == 1


def test_an_older_copy_is_replaced_and_a_disabled_mod_enabled(tmp_path):
    (tmp_path / "world.mt").write_text("load_mod_eventsite = false\n")
    install.install(tmp_path)
    (tmp_path / "worldmods" / "eventsite" / "init.lua").write_text("-- old")
    (tmp_path / "world.mt").write_text("gameid = minetest\nload_mod_eventsite = false\n")
    changed = install.install(tmp_path)
    assert len(changed) == 2
    assert "load_mod_eventsite = true" in (tmp_path / "world.mt").read_text()
    assert (tmp_path / "worldmods" / "eventsite" / "init.lua").read_text() != "-- old"


def test_a_world_without_world_mt_gets_one_with_its_game(tmp_path):
    install.install(tmp_path, gameid="devtest")
    assert (tmp_path / "world.mt").read_text() == "gameid = devtest\nload_mod_eventsite = true\n"


def test_the_command_refuses_what_it_cannot_install_into(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        call_command("luanti_install_mod", str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("")
    with pytest.raises(CommandError, match="not a directory"):
        call_command("luanti_install_mod", str(tmp_path / "file"))
    other = tmp_path / "worldmods" / "eventsite"
    other.mkdir(parents=True)
    (other / "mod.conf").write_text("name = something_else\n")
    with pytest.raises(CommandError, match="is not the eventsite mod"):
        call_command("luanti_install_mod", str(tmp_path))


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("", {}),
        ("/srv/w", {"": "/srv/w"}),
        ("north=/srv/n, south=/srv/s", {"north": "/srv/n", "south": "/srv/s"}),
    ],
)
def test_luanti_worlds_names_the_backends(raw, expected):
    assert {name: str(w.path) for name, w in worlds.parse(raw).items()} == expected


@pytest.mark.parametrize(
    "raw,message",
    [
        ("/a,/b", "has no name"),
        ("north=/a,north=/b", "twice"),
        ("no rth=/a", "is not a name"),
        ("north=", "names no world"),
    ],
)
def test_luanti_worlds_that_cannot_be_read_are_refused_naming_why(raw, message):
    with pytest.raises(worlds.WorldError, match=message):
        worlds.parse(raw)


def test_a_step_names_its_world_by_shard_and_a_lone_world_needs_none():
    with override_settings(LUANTI_WORLDS="/srv/w"):
        assert SPAWN.backend_of({"entity": "wolf", "count": 1, "at": [0, 0, 0]}) == ""
        assert TIME_SPEED.backend_of("default") == ""
    with override_settings(LUANTI_WORLDS="main=/srv/w"):
        assert SPAWN.backend_of({"entity": "wolf", "count": 1, "at": [0, 0, 0]}) == "main"
        assert TIME_SPEED.backend_of("default") == "main"
    with override_settings(LUANTI_WORLDS="north=/n,south=/s"):
        assert SPAWN.backend_of({"shard": "south"}) == "south"
        assert TIME_SPEED.backend_of("north") == "north"
        params = {"entity": "w", "count": 1, "at": [0, 0, 0]}
        answer = SPAWN.perform(run_id=1, step_id=1, params=params, idempotency_key="k")
        assert answer["ok"] is False and answer["retry"] is False and "say which with shard" in answer["error"]
        answer = SPAWN.perform(run_id=1, step_id=1, params={**params, "shard": "east"}, idempotency_key="k")
        assert "no world 'east'" in answer["error"]


def test_a_server_that_never_ran_or_stopped_beating_is_unavailable_at_once(tmp_path):
    with override_settings(LUANTI_WORLDS=str(tmp_path), LUANTI_HEARTBEAT_STALE_S=2):
        started = time.monotonic()
        answer = SPAWN.health()
        assert answer["ok"] is False and answer["unavailable"] is True and "no heartbeat" in answer["error"]
        beat = tmp_path / "eventsite" / "heartbeat.json"
        beat.parent.mkdir()
        beat.write_text('{"boot_id": "b"}')
        os.utime(beat, (time.time() - 30, time.time() - 30))
        answer = TIME_SPEED.read(target="default")
        assert answer["unavailable"] is True and "heartbeat is 30 s old" in answer["error"]
        assert time.monotonic() - started < 1
        assert not (tmp_path / "eventsite" / "inbox").exists() or not os.listdir(tmp_path / "eventsite" / "inbox")


def test_a_request_nobody_takes_is_withdrawn_and_never_lands(tmp_path):
    box = tmp_path / "eventsite"
    (box / "inbox").mkdir(parents=True)
    (box / "outbox").mkdir()
    (box / "heartbeat.json").write_text('{"boot_id": "b"}')
    reply = mailbox.call(worlds.World("", tmp_path), "health", timeout=200)
    assert reply.unavailable and "withdrawn, it never landed" in reply.error
    assert os.listdir(box / "inbox") == []


def test_what_the_mod_writes_is_read_back_as_it_was_meant():
    assert mailbox.normalize({"value": 72.0, "rate": 2.5, "present": None, "n": [1.0]}) == {
        "value": 72,
        "rate": 2.5,
        "present": [],
        "n": [1],
    }


def test_the_luanti_demo_says_how_to_install_the_server_when_it_is_missing(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from eventsite.luanti import demo

    said, stopped = [], []
    fake = SimpleNamespace(say=said.append, stop_all=lambda: stopped.append(True))
    monkeypatch.setattr(demo, "BINARY", tmp_path / "minetestserver")
    demo.main(fake, tmp_path, "password")
    assert stopped and any("apt-get install minetest-server" in line for line in said), said
