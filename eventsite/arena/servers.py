"""The arena module's servers as a setting: ``ARENA_SERVERS``, read and checked.

``ARENA_SERVERS`` is a comma-separated list of ``name=host:port`` pairs, such as
``north=127.0.0.1:27960,south=127.0.0.1:27961``. Each name is a backend of the module
(letters, digits, ``.``, ``_`` and ``-``, at most 100 characters, starting with a letter or a
digit: no ``:``, which separates the server from the cvar in a lease target such as
``north:g_gravity``). A lone ``host:port`` without a name is one server whose backend is
``""``. Names and addresses are each used once.

This file uses the standard library only, so that the site's settings can import it.
May import: the standard library only.
"""

import re

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})\Z")


class BadServers(ValueError):
    """An ``ARENA_SERVERS`` that cannot be used; the message names the bad item."""


def _address(item: str, text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise BadServers(f"{item!r}: {text!r} is not host:port")
    if not HOST.match(host):
        raise BadServers(f"{item!r}: {host!r} is not a host name or an IPv4 address")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadServers(f"{item!r}: the port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def parse_servers(text: str | None) -> dict[str, tuple[str, int]]:
    """``{name: (host, port)}`` from ``"north=127.0.0.1:27960,south=…"``, in the order given.

    A lone ``host:port`` is the server ``""``. Empty items are ignored; an empty text is no
    server at all. Raises `BadServers` naming the first bad item.
    """
    servers: dict[str, tuple[str, int]] = {}
    by_address: dict[tuple[str, int], str] = {}
    items = [raw.strip() for raw in (text or "").split(",") if raw.strip()]
    for item in items:
        name, sep, address = item.partition("=")
        if not sep:
            if len(items) > 1:
                raise BadServers(f"{item!r}: with several servers, each is a name=host:port pair")
            name, address = "", item
        name, address = name.strip(), address.strip()
        if sep and not NAME.match(name):
            raise BadServers(
                f"{item!r}: a server's name is letters, digits, '.', '_' or '-' (at most 100, "
                f"starting with a letter or a digit), not {name!r}"
            )
        if name in servers:
            raise BadServers(f"{item!r}: the server {name!r} is named twice")
        where = _address(item, address)
        if where in by_address:
            raise BadServers(f"{item!r}: {where[0]}:{where[1]} is already the server {by_address[where]!r}")
        servers[name] = where
        by_address[where] = name
    return servers
