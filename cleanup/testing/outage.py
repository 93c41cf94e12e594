"""A simulated outage: while it lasts, no socket of this process connects, sends or reads.

Also the shapes of the kit's other simulated conditions (`Refusal`).

It stands for "the backend is down" for any module that reaches its backend over the
network from Python (HTTP, Redis, a game protocol). A backend reached through a C driver
or in memory needs its own outage: pass the kit any context manager factory instead.
May import: the standard library only.
"""

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import NoReturn, TypeAlias

# What the kit takes as an outage: a factory of context managers (such as `network_down`)
# during which the backend cannot be reached.
Outage: TypeAlias = Callable[[], AbstractContextManager[object]]
# What the kit takes as a refusal: a factory of context managers, given refs, during which
# the backend answers but refuses to give those things back (a creature in combat).
Refusal: TypeAlias = Callable[[Sequence[str]], AbstractContextManager[object]]

_lock = threading.Lock()
_PATCHED = ("connect", "connect_ex", "send", "sendall", "sendto", "recv", "recv_into", "recvfrom")


def _refuse(*args: object, **kwargs: object) -> NoReturn:
    raise ConnectionRefusedError("the conformance kit's outage: the backend cannot be reached")


@contextlib.contextmanager
def network_down() -> Iterator[None]:
    with _lock:
        saved = {name: socket.socket.__dict__.get(name) for name in _PATCHED}
        for name in _PATCHED:
            setattr(socket.socket, name, _refuse)
        try:
            yield
        finally:
            for name, original in saved.items():
                if original is None:
                    delattr(socket.socket, name)
                else:
                    setattr(socket.socket, name, original)
