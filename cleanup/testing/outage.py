"""Simulated outages: while `network_down` lasts, no socket of this process connects, sends
or reads (a refused connection); while `network_silent` lasts, whatever is sent is dropped
and nothing answers until the socket's own timeout (a frozen server, a firewall, a request
dropped for its rate: the silence a UDP backend gives).

Also the shapes of the kit's other simulated conditions (`Refusal`).

It stands for "the backend is down" for any module that reaches its backend over the
network from Python (HTTP, Redis, a game protocol). A backend reached through a C driver
or in memory needs its own outage: pass the kit any context manager factory instead.
May import: the standard library only.
"""

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    with _sockets_answering(dict.fromkeys(_PATCHED, _refuse)):
        yield


@contextlib.contextmanager
def _sockets_answering(methods: Mapping[str, object]) -> Iterator[None]:
    """Every socket of this process answers with ``methods`` meanwhile (one outage at a time),
    its own methods put back after."""
    with _lock:
        saved = {name: socket.socket.__dict__.get(name) for name in methods}
        for name, method in methods.items():
            setattr(socket.socket, name, method)
        try:
            yield
        finally:
            for name, original in saved.items():
                if original is None:
                    delattr(socket.socket, name)
                else:
                    setattr(socket.socket, name, original)


# The longest a read waits in a silent outage when its socket has no timeout of its own.
SILENT_WAIT_S = 30.0
_quiet = threading.Event()


def _silent_connect(self: socket.socket, *args: object) -> None:
    if self.type == socket.SOCK_DGRAM:
        return None  # a datagram socket's connect sends nothing: it succeeds
    _wait_out(self)


def _silent_connect_ex(self: socket.socket, *args: object) -> int:
    if self.type == socket.SOCK_DGRAM:
        return 0
    _wait_out(self)
    return 0  # not reached


def _silent_send(self: socket.socket, data: bytes, *args: object) -> int:
    return len(data)  # sent into the void


def _silent_sendall(self: socket.socket, data: bytes, *args: object) -> None:
    return None


def _silent_read(self: socket.socket, *args: object) -> NoReturn:
    _wait_out(self)


def _wait_out(sock: socket.socket) -> NoReturn:
    timeout = sock.gettimeout()
    wait = SILENT_WAIT_S if timeout is None else min(timeout, SILENT_WAIT_S)
    _quiet.wait(wait) if wait > 0 else None
    time.sleep(0)
    raise TimeoutError("the conformance kit's silent outage: nothing answered")


_SILENT = {
    "connect": _silent_connect,
    "connect_ex": _silent_connect_ex,
    "send": _silent_send,
    "sendall": _silent_sendall,
    "sendto": _silent_send,
    "recv": _silent_read,
    "recv_into": _silent_read,
    "recvfrom": _silent_read,
}


@contextlib.contextmanager
def network_silent() -> Iterator[None]:
    """No socket of this process hears an answer: what is sent is dropped, and each read or
    TCP connect waits out its socket's timeout (at most ``SILENT_WAIT_S``), then times out."""
    _quiet.clear()
    with _sockets_answering(_SILENT):
        yield
