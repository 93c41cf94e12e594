"""The worlds the module drives, from ``LUANTI_WORLDS``: each one backend of the module.

``LUANTI_WORLDS`` is ``name=world_dir`` pairs, comma-separated
(``north=/srv/luanti/north,south=/srv/luanti/south``); a bare ``world_dir`` is one world
without a name, the backend ``""``. Read at the moment of use, so ``override_settings``
and a changed deployment both take effect. May import: Django's settings only.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
# What a lease's target may say for the one world that has no name.
DEFAULT_TARGET = "default"


class WorldError(ValueError):
    """``LUANTI_WORLDS`` cannot be read, or names no such world."""


@dataclass(frozen=True)
class World:
    name: str  # the backend's name: "" for a lone world without one
    path: Path

    @property
    def label(self) -> str:
        return f"the Luanti world {self.name!r} ({self.path})" if self.name else f"the Luanti world at {self.path}"


def parse(raw: str) -> dict[str, World]:
    """``{name: World}`` from a ``LUANTI_WORLDS`` value; raises `WorldError` naming the fault."""
    worlds: dict[str, World] = {}
    items = [item.strip() for item in str(raw or "").split(",") if item.strip()]
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = "", item
            if len(items) > 1:
                raise WorldError(f"LUANTI_WORLDS: {item!r} has no name; with several worlds each is name=world_dir")
        name, path = name.strip(), path.strip()
        if sep and not NAME.fullmatch(name):
            raise WorldError(f"LUANTI_WORLDS: {name!r} is not a name (letters, digits, _ . -, at most 100)")
        if not path:
            raise WorldError(f"LUANTI_WORLDS: {item!r} names no world directory")
        if name in worlds:
            raise WorldError(f"LUANTI_WORLDS names {name!r} twice")
        worlds[name] = World(name, Path(path))
    return worlds


def configured() -> dict[str, World]:
    return parse(getattr(settings, "LUANTI_WORLDS", ""))


def backend_named(shard: object) -> str:
    """The backend a step's ``shard`` param names: itself, or the lone world's name when absent."""
    if isinstance(shard, str) and shard:
        return shard
    try:
        worlds = configured()
    except WorldError:
        return ""
    return next(iter(worlds)) if len(worlds) == 1 else ""


def backend_of_target(target: object) -> str:
    """The backend a lease's target names: a world's name, or ``default`` for the lone world."""
    if not isinstance(target, str) or target in ("", DEFAULT_TARGET):
        return backend_named("")
    return target


def world(backend: str) -> World:
    """The world of one backend; raises `WorldError` with a sentence a person can act on."""
    worlds = configured()
    if not worlds:
        raise WorldError("LUANTI_WORLDS is not set: name the world directory of each Luanti server")
    if backend == "" and len(worlds) == 1:
        return next(iter(worlds.values()))
    if backend in worlds:
        return worlds[backend]
    known = ", ".join(repr(n) for n in worlds) or "none"
    if backend == "":
        raise WorldError(f"LUANTI_WORLDS names several worlds ({known}): say which with shard")
    raise WorldError(f"LUANTI_WORLDS names no world {backend!r} (it names {known})")
