"""The sandbox shard, as a real process over HTTP: its answers, its world, its faults."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests import shard as shard_helpers
from tests.shard import ROOT, start_shard

shard_process = shard_helpers.shard_process  # a fixture: a fresh shard per test

pytestmark = pytest.mark.slow  # every test talks to a shard process

SPAWN = {"key": "run-1/step-1", "creature": "orc", "count": 3, "at": "north-gate"}


@pytest.fixture(scope="module")
def shared_shard():
    """One shard for the tests that only send input it must refuse (nothing changes)."""
    with start_shard() as process:
        yield process


def spawn(shard, **changes):
    response = shard.post("/spawn", json={**SPAWN, **changes})
    assert response.status_code in (200, 201), response.text
    return response.json()


def refs_of(creatures):
    return [c["ref"] for c in creatures]


def by_key(shard, key):
    response = shard.get("/creatures", params={"key": key})
    assert response.status_code == 200, response.text
    return response.json()["creatures"]


def rate(shard, name):
    response = shard.get(f"/spawners/{name}")
    assert response.status_code == 200, response.text
    return response.json()["rate"]


def raw_exchange(url, data, timeout=5.0):
    """Send raw bytes, answer (status, body) of what came back."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body), head.decode()


# -- refusing bad input -----------------------------------------------------------------

OK_PUT = {"rate": 2.0}

# (method, path, json body or raw bytes, status, field the message must name)
BAD_INPUT = [
    # bodies that are no JSON object
    ("POST", "/spawn", b"", 400, "JSON object"),
    ("POST", "/spawn", b"{not json", 400, "not valid JSON"),
    ("POST", "/spawn", b"[1, 2]", 400, "JSON object"),
    ("POST", "/spawn", b'"orc"', 400, "JSON object"),
    ("POST", "/spawn", b'{"key": "k", "creature": "orc", "count": NaN, "at": "a"}', 400, "NaN"),
    ("POST", "/spawn", b"\xff\xfe{}", 400, "UTF-8"),
    # spawn, field by field
    ("POST", "/spawn", {**SPAWN, "key": None}, 400, "key"),
    ("POST", "/spawn", {k: v for k, v in SPAWN.items() if k != "key"}, 400, "key"),
    ("POST", "/spawn", {**SPAWN, "key": ""}, 400, "key"),
    ("POST", "/spawn", {**SPAWN, "key": "   "}, 400, "key"),
    ("POST", "/spawn", {**SPAWN, "key": 7}, 400, "key"),
    ("POST", "/spawn", {**SPAWN, "key": "k" * 201}, 400, "key"),
    ("POST", "/spawn", {k: v for k, v in SPAWN.items() if k != "creature"}, 400, "creature"),
    ("POST", "/spawn", {**SPAWN, "creature": ""}, 400, "creature"),
    ("POST", "/spawn", {**SPAWN, "creature": ["orc"]}, 400, "creature"),
    ("POST", "/spawn", {k: v for k, v in SPAWN.items() if k != "count"}, 400, "count"),
    ("POST", "/spawn", {**SPAWN, "count": 0}, 400, "count"),
    ("POST", "/spawn", {**SPAWN, "count": -1}, 400, "count"),
    ("POST", "/spawn", {**SPAWN, "count": 501}, 400, "count"),
    ("POST", "/spawn", {**SPAWN, "count": 2.5}, 400, "count"),
    ("POST", "/spawn", {**SPAWN, "count": "3"}, 400, "count"),
    ("POST", "/spawn", {**SPAWN, "count": True}, 400, "count"),
    ("POST", "/spawn", {**SPAWN, "count": None}, 400, "count"),
    ("POST", "/spawn", {k: v for k, v in SPAWN.items() if k != "at"}, 400, "at"),
    ("POST", "/spawn", {**SPAWN, "at": ""}, 400, "at"),
    ("POST", "/spawn", {**SPAWN, "at": {"x": 1}}, 400, "at"),
    ("POST", "/spawn", {**SPAWN, "cout": 3}, 400, "cout"),
    # despawn and lookup
    ("POST", "/despawn", {}, 400, "refs"),
    ("POST", "/despawn", {"refs": "cr-1"}, 400, "refs"),
    ("POST", "/despawn", {"refs": [1]}, 400, "refs"),
    ("POST", "/despawn", {"refs": [""]}, 400, "refs"),
    ("POST", "/despawn", {"refs": [None]}, 400, "refs"),
    ("POST", "/despawn", {"refs": [f"cr-{i}" for i in range(1001)]}, 400, "refs"),
    ("POST", "/despawn", {"refs": [], "key": "k"}, 400, "key"),
    ("POST", "/despawn", b"nope", 400, "JSON"),
    ("POST", "/creatures/lookup", {}, 400, "refs"),
    ("POST", "/creatures/lookup", {"refs": {"a": 1}}, 400, "refs"),
    ("POST", "/creatures/lookup", {"refs": [3]}, 400, "refs"),
    # listing creatures
    ("GET", "/creatures?key=", None, 400, "key"),
    ("GET", "/creatures?kee=run-1", None, 400, "kee"),
    ("GET", "/creatures?key=a&key=b", None, 400, "key"),
    # spawners
    ("GET", "/spawners/no-such-spawner", None, 404, "no-such-spawner"),
    ("PUT", "/spawners/no-such-spawner", OK_PUT, 404, "no-such-spawner"),
    ("PUT", "/spawners/orc-camp", {}, 400, "rate"),
    ("PUT", "/spawners/orc-camp", {"rate": "2"}, 400, "rate"),
    ("PUT", "/spawners/orc-camp", {"rate": -1}, 400, "rate"),
    ("PUT", "/spawners/orc-camp", {"rate": True}, 400, "rate"),
    ("PUT", "/spawners/orc-camp", {"rate": None}, 400, "rate"),
    ("PUT", "/spawners/orc-camp", {"rate": 1e12}, 400, "rate"),
    ("PUT", "/spawners/orc-camp", {"rate": 2, "expected": "1"}, 400, "expected"),
    ("PUT", "/spawners/orc-camp", {"rate": 2, "expected": None}, 400, "expected"),
    ("PUT", "/spawners/orc-camp", {"rate": 2, "expect": 1}, 400, "expect"),
    ("PUT", "/spawners/orc-camp", b"{", 400, "JSON"),
    ("PUT", "/spawners/orc-camp", b'{"rate": Infinity}', 400, "Infinity"),
    # faults
    ("POST", "/faults", {"latency_ms": -1}, 400, "latency_ms"),
    ("POST", "/faults", {"latency_ms": 1.5}, 400, "latency_ms"),
    ("POST", "/faults", {"latency_ms": True}, 400, "latency_ms"),
    ("POST", "/faults", {"latency_ms": 60_001}, 400, "latency_ms"),
    ("POST", "/faults", {"error_rate": 1.5}, 400, "error_rate"),
    ("POST", "/faults", {"error_rate": -0.1}, 400, "error_rate"),
    ("POST", "/faults", {"error_rate": "0.5"}, 400, "error_rate"),
    ("POST", "/faults", {"error_rate": True}, 400, "error_rate"),
    ("POST", "/faults", {"down": True}, 400, "down"),
    ("POST", "/faults", {"down": "yes"}, 400, "down"),
    ("POST", "/faults", {"down": 0}, 400, "down"),
    ("POST", "/faults", {"down": None}, 400, "down"),
    ("POST", "/faults", {"slow": 1}, 400, "slow"),
    ("POST", "/faults", {"stuck": "wolf"}, 400, "stuck"),
    ("POST", "/faults", {"stuck": [""]}, 400, "stuck"),
    ("POST", "/faults", {"stuck": [3]}, 400, "stuck"),
    ("POST", "/faults", {"stuck": ["x"] * 101}, 400, "stuck"),
    ("POST", "/faults", {"stuck": ["x" * 201]}, 400, "stuck"),
    ("POST", "/faults", [], 400, "JSON object"),
    # drift
    ("POST", "/drift", {"rate": 1}, 400, "spawner"),
    ("POST", "/drift", {"spawner": "", "rate": 1}, 400, "spawner"),
    ("POST", "/drift", {"spawner": "bad name!", "rate": 1}, 400, "spawner"),
    ("POST", "/drift", {"spawner": "orc-camp"}, 400, "rate"),
    ("POST", "/drift", {"spawner": "orc-camp", "rate": "fast"}, 400, "rate"),
    ("POST", "/drift", {"spawner": "orc-camp", "rate": 1, "why": "x"}, 400, "why"),
    # restart
    ("POST", "/restart", {"mode": "crash"}, 400, "mode"),
    ("POST", "/restart", {"mode": 1}, 400, "mode"),
    ("POST", "/restart", {"mode": "wipe", "now": True}, 400, "now"),
    ("POST", "/restart", b"[]", 400, "JSON object"),
    # routes and methods
    ("GET", "/nowhere", None, 404, "/nowhere"),
    ("POST", "/spawners/orc-camp/extra", OK_PUT, 404, "/spawners/orc-camp/extra"),
    ("GET", "/spawn", None, 405, "POST"),
    ("DELETE", "/spawn", None, 405, "POST"),
    ("POST", "/health", {}, 405, "GET"),
    ("PATCH", "/spawners/orc-camp", OK_PUT, 405, "PUT"),
]


@pytest.mark.parametrize(
    "method,path,body,status,names",
    BAD_INPUT,
    ids=[f"{m} {p} {i}" for i, (m, p, *_rest) in enumerate(BAD_INPUT)],
)
def test_bad_input_answers_an_error_naming_the_field_and_the_shard_survives(
    shared_shard, method, path, body, status, names
):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = shared_shard.request(method, path, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-boot-id"] == shared_shard.boot_id
    error = response.json()["error"]
    assert isinstance(error, str) and names in error
    assert shared_shard.get("/health").status_code == 200


def test_bad_input_changes_nothing(shared_shard):
    assert shared_shard.get("/creatures", params={"key": SPAWN["key"]}).json() == {"creatures": []}
    assert rate(shared_shard, "orc-camp") == 1.0
    assert shared_shard.get("/faults").json() == {"latency_ms": 0, "error_rate": 0.0, "down": False, "stuck": []}
    assert shared_shard.get("/health").json()["boot_id"] == shared_shard.boot_id


def test_a_refused_field_is_named_in_the_field_key(shared_shard):
    response = shared_shard.post("/spawn", json={**SPAWN, "count": 0})
    assert response.json()["field"] == "count"


def test_a_garbled_request_line_answers_json_400(shared_shard):
    status, body, _ = raw_exchange(shared_shard.url, b"GARBAGE\r\n\r\n")
    assert status == 400
    assert "error" in body


def test_an_unsupported_method_answers_json_405(shared_shard):
    status, body, head = raw_exchange(shared_shard.url, b"OPTIONS /health HTTP/1.0\r\n\r\n")
    assert status == 405
    assert "OPTIONS" in body["error"]
    assert "X-Boot-Id: " in head


def test_a_content_length_that_is_no_number_answers_400(shared_shard):
    request = b"POST /spawn HTTP/1.0\r\nContent-Length: lots\r\n\r\n{}"
    status, body, _ = raw_exchange(shared_shard.url, request)
    assert status == 400
    assert "Content-Length" in body["error"]


def test_a_body_that_is_too_large_answers_413(shared_shard):
    request = b"POST /spawn HTTP/1.0\r\nContent-Length: 5000000\r\n\r\n"
    status, body, _ = raw_exchange(shared_shard.url, request)
    assert status == 413
    assert "at most" in body["error"]


def test_a_body_shorter_than_its_content_length_answers_400(shared_shard):
    request = b"POST /spawn HTTP/1.0\r\nContent-Length: 50\r\n\r\n{}"
    status, body, _ = raw_exchange(shared_shard.url, request)
    assert status == 400
    assert "ended after 2 of 50 bytes" in body["error"]


# -- health and boot id ------------------------------------------------------------------


def test_health_names_the_boot_id_in_the_body_and_the_header(shard_process):
    response = shard_process.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["boot_id"] == shard_process.boot_id == response.headers["x-boot-id"]
    assert body["creatures"] == 3  # the shard's own ambient creatures
    assert body["saved_at"] >= body["started_at"]


def test_each_start_takes_a_new_boot_id(shard_process):
    with start_shard() as other:
        assert other.boot_id != shard_process.boot_id


# -- spawn -------------------------------------------------------------------------------


def test_spawn_creates_count_creatures_with_ref_kind_place_and_key(shard_process):
    response = shard_process.post("/spawn", json=SPAWN)
    assert response.status_code == 201
    body = response.json()
    assert body["key"] == SPAWN["key"] and body["replayed"] is False
    assert len(body["creatures"]) == 3
    assert len(set(refs_of(body["creatures"]))) == 3
    for creature in body["creatures"]:
        assert creature["kind"] == "orc"
        assert creature["at"] == "north-gate"
        assert creature["key"] == SPAWN["key"]
    assert by_key(shard_process, SPAWN["key"]) == body["creatures"]


def test_spawn_again_with_the_same_key_answers_the_same_creatures_and_spawns_nothing(
    shard_process,
):
    first = spawn(shard_process)
    total = shard_process.get("/health").json()["creatures"]
    again = shard_process.post("/spawn", json=SPAWN)
    assert again.status_code == 200
    assert again.json()["replayed"] is True
    assert again.json()["creatures"] == first["creatures"]
    assert shard_process.get("/health").json()["creatures"] == total


def test_spawn_replay_names_the_creatures_despawned_since(shard_process):
    first = refs_of(spawn(shard_process)["creatures"])
    shard_process.post("/despawn", json={"refs": first[:1]})
    again = spawn(shard_process)
    assert refs_of(again["creatures"]) == first
    assert again["despawned"] == first[:1]
    assert refs_of(by_key(shard_process, SPAWN["key"])) == first[1:]


def test_a_revoked_key_spawns_nothing_more_and_keeps_what_it_made(shard_process):
    made = refs_of(spawn(shard_process)["creatures"])
    from urllib.parse import quote

    response = shard_process.post(f"/spawns/{quote(SPAWN['key'], safe='')}/revoke")
    assert (response.status_code, response.json()) == (200, {"key": SPAWN["key"], "revoked": True})
    refused = shard_process.post("/spawn", json=SPAWN)
    assert refused.status_code == 409 and "given back" in refused.json()["error"]
    fresh = shard_process.post("/spawn", json={**SPAWN, "key": "never-spawned"})
    assert fresh.status_code == 201
    shard_process.post("/spawns/never-spawned/revoke")
    assert shard_process.post("/spawn", json={**SPAWN, "key": "never-spawned"}).status_code == 409
    assert refs_of(by_key(shard_process, SPAWN["key"])) == made, "revoking despawned something"


def test_spawn_with_a_used_key_and_other_params_answers_409(shard_process):
    spawn(shard_process)
    response = shard_process.post("/spawn", json={**SPAWN, "count": 4})
    assert response.status_code == 409
    assert response.json()["field"] == "key"
    assert "already spawned 3 orc" in response.json()["error"]
    assert len(by_key(shard_process, SPAWN["key"])) == 3


def test_connections_a_sweep_opens_at_once_wait_for_a_busy_shard_instead_of_being_dropped():
    from eventsite.sandbox.shard import ShardServer

    server = ShardServer(("127.0.0.1", 0))  # listening, but accepting nothing: a busy shard
    try:
        # Two sweepers' calls and then some, each on its own connection; a dropped one
        # would not connect before its timeout.
        connections = [socket.create_connection(server.server_address, timeout=2) for _ in range(24)]
        peers = {connection.getpeername() for connection in connections}
    finally:
        server.server_close()
    for connection in connections:
        connection.close()
    assert peers == {server.server_address}


def test_concurrent_spawns_with_one_key_spawn_once(shard_process):
    answers = []

    def call():
        answers.append(shard_process.post("/spawn", json=SPAWN))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers) == [200] * 7 + [201]
    assert len({tuple(refs_of(a.json()["creatures"])) for a in answers}) == 1
    assert len(by_key(shard_process, SPAWN["key"])) == 3


def test_count_bounds_1_and_500_are_accepted(shard_process):
    assert len(spawn(shard_process, key="one", count=1)["creatures"]) == 1
    assert len(spawn(shard_process, key="many", count=500)["creatures"]) == 500


# -- despawn, listing, lookup ------------------------------------------------------------


def test_despawn_removes_the_creatures_and_names_them(shard_process):
    refs = refs_of(spawn(shard_process)["creatures"])
    response = shard_process.post("/despawn", json={"refs": refs[:2]})
    assert response.status_code == 200
    assert response.json() == {"removed": refs[:2], "absent": [], "refused": []}
    assert refs_of(by_key(shard_process, SPAWN["key"])) == refs[2:]


def test_despawn_of_a_ref_already_gone_or_never_there_is_success(shard_process):
    refs = refs_of(spawn(shard_process)["creatures"])
    shard_process.post("/despawn", json={"refs": refs})
    again = shard_process.post("/despawn", json={"refs": [*refs, "cr-never-was"]})
    assert again.status_code == 200
    assert again.json() == {"removed": [], "absent": [*refs, "cr-never-was"], "refused": []}


def test_despawn_of_nothing_is_success(shard_process):
    response = shard_process.post("/despawn", json={"refs": []})
    assert response.status_code == 200
    assert response.json() == {"removed": [], "absent": [], "refused": []}


def test_creatures_lists_by_key_or_all(shard_process):
    a = refs_of(spawn(shard_process, key="a")["creatures"])
    b = refs_of(spawn(shard_process, key="b", count=1)["creatures"])
    assert refs_of(by_key(shard_process, "a")) == a
    assert refs_of(by_key(shard_process, "b")) == b
    assert by_key(shard_process, "nobody") == []
    everything = shard_process.get("/creatures").json()["creatures"]
    assert set(a + b) <= set(refs_of(everything))
    assert sum(1 for c in everything if c["key"] is None) == 3  # ambient


def test_lookup_splits_refs_into_present_and_absent(shard_process):
    refs = refs_of(spawn(shard_process)["creatures"])
    shard_process.post("/despawn", json={"refs": refs[:1]})
    response = shard_process.post("/creatures/lookup", json={"refs": [*refs, "cr-x"]})
    assert response.status_code == 200
    assert response.json() == {"present": refs[1:], "absent": [refs[0], "cr-x"]}


# -- spawners ----------------------------------------------------------------------------


def test_spawners_start_with_their_rates(shard_process):
    assert shard_process.get("/spawners").json()["spawners"] == [
        {"name": "goblin-cave", "rate": 2.0},
        {"name": "orc-camp", "rate": 1.0},
        {"name": "wolf-den", "rate": 0.5},
    ]
    assert shard_process.get("/spawners/orc-camp").json() == {"name": "orc-camp", "rate": 1.0}


def test_put_sets_the_rate_and_answers_the_previous_one(shard_process):
    response = shard_process.put("/spawners/orc-camp", json={"rate": 4})
    assert response.status_code == 200
    assert response.json() == {"name": "orc-camp", "rate": 4.0, "previous": 1.0}
    assert rate(shard_process, "orc-camp") == 4.0


def test_put_with_the_expected_rate_sets_it(shard_process):
    response = shard_process.put("/spawners/orc-camp", json={"rate": 3, "expected": 1.0})
    assert response.status_code == 200
    assert rate(shard_process, "orc-camp") == 3.0


def test_put_with_another_expected_rate_answers_409_with_the_current_rate(shard_process):
    response = shard_process.put("/spawners/orc-camp", json={"rate": 3, "expected": 5})
    assert response.status_code == 409
    assert response.json()["current"] == 1.0
    assert "expected" in response.json()["error"]
    assert rate(shard_process, "orc-camp") == 1.0


def test_a_spawner_name_is_percent_decoded(shard_process):
    shard_process.post("/drift", json={"spawner": "camp.2", "rate": 1})
    assert shard_process.get("/spawners/camp%2E2").json()["name"] == "camp.2"


# -- save and restart --------------------------------------------------------------------


def test_restart_rolls_the_world_back_to_the_last_save(shard_process):
    saved = refs_of(spawn(shard_process, key="before")["creatures"])
    shard_process.put("/spawners/orc-camp", json={"rate": 3})
    assert shard_process.post("/save").status_code == 200
    later = refs_of(spawn(shard_process, key="after")["creatures"])
    shard_process.post("/despawn", json={"refs": saved})
    shard_process.put("/spawners/orc-camp", json={"rate": 9})

    response = shard_process.post("/restart")  # no body: rollback, as after a crash
    assert response.status_code == 200
    body = response.json()
    assert body["mode"] == "rollback"
    assert body["previous_boot_id"] == shard_process.boot_id
    assert body["boot_id"] != shard_process.boot_id
    assert response.headers["x-boot-id"] == body["boot_id"]
    assert shard_process.get("/health").json()["boot_id"] == body["boot_id"]

    assert by_key(shard_process, "after") == []  # spawned since the save: gone
    assert refs_of(by_key(shard_process, "before")) == saved  # despawned since: back
    assert shard_process.post("/creatures/lookup", json={"refs": later}).json()["present"] == []
    assert rate(shard_process, "orc-camp") == 3.0  # as saved
    # The shard forgot the key too: the same spawn again makes new creatures.
    again = shard_process.post("/spawn", json={**SPAWN, "key": "after"})
    assert again.status_code == 201
    assert set(refs_of(again.json()["creatures"])).isdisjoint(later)


def test_restart_before_any_save_returns_to_the_world_it_started_with(shard_process):
    spawn(shard_process)
    shard_process.put("/spawners/wolf-den", json={"rate": 7})
    shard_process.post("/restart", json={"mode": "rollback"})
    assert by_key(shard_process, SPAWN["key"]) == []
    assert rate(shard_process, "wolf-den") == 0.5
    assert shard_process.get("/health").json()["creatures"] == 3


def test_restart_wipe_forgets_event_spawns_and_keeps_ambient_creatures_and_rates(shard_process):
    saved = refs_of(spawn(shard_process, key="before")["creatures"])
    shard_process.post("/save")
    spawn(shard_process, key="after")
    shard_process.put("/spawners/goblin-cave", json={"rate": 6})
    ambient = [c for c in shard_process.get("/creatures").json()["creatures"] if c["key"] is None]

    response = shard_process.post("/restart", json={"mode": "wipe"})
    assert response.status_code == 200
    assert response.json()["mode"] == "wipe"
    assert response.json()["boot_id"] != shard_process.boot_id
    assert shard_process.get("/creatures").json()["creatures"] == ambient
    assert rate(shard_process, "goblin-cave") == 6.0

    # A later rollback does not bring the wiped spawns back from the save.
    shard_process.post("/restart")
    assert shard_process.post("/creatures/lookup", json={"refs": saved}).json()["present"] == []
    assert by_key(shard_process, "after") == []


def test_each_restart_takes_a_new_boot_id(shard_process):
    ids = {shard_process.boot_id}
    for mode in ("rollback", "wipe", "rollback"):
        ids.add(shard_process.post("/restart", json={"mode": mode}).json()["boot_id"])
    assert len(ids) == 4


def test_save_answers_when_it_saved(shard_process):
    before = time.time()
    response = shard_process.post("/save")
    assert response.status_code == 200
    assert response.json()["saved_at"] >= before - 1
    assert response.json()["creatures"] == 3


def test_the_world_is_saved_periodically():
    with start_shard(save_every=0.1) as shard:
        refs = refs_of(spawn(shard)["creatures"])
        spawned = time.time()
        deadline = time.monotonic() + 5
        while shard.get("/health").json()["saved_at"] <= spawned:
            assert time.monotonic() < deadline, "the shard never saved on its own"
            time.sleep(0.02)
        shard.post("/restart")
        assert refs_of(by_key(shard, SPAWN["key"])) == refs


# -- faults ------------------------------------------------------------------------------


def test_faults_start_cleared_and_update_field_by_field(shard_process):
    assert shard_process.get("/faults").json() == {
        "latency_ms": 0,
        "error_rate": 0.0,
        "down": False,
        "stuck": [],
    }
    shard_process.post("/faults", json={"latency_ms": 5})
    answer = shard_process.post("/faults", json={"error_rate": 0.25}).json()
    assert answer == {"latency_ms": 5, "error_rate": 0.25, "down": False, "stuck": []}
    assert shard_process.delete("/faults").json() == {
        "latency_ms": 0,
        "error_rate": 0.0,
        "down": False,
        "stuck": [],
    }


def test_a_stuck_creature_refuses_to_be_despawned_while_the_rest_go(shard_process):
    refs = refs_of(spawn(shard_process)["creatures"])
    assert shard_process.post("/faults", json={"stuck": [refs[0]]}).json()["stuck"] == [refs[0]]
    answer = shard_process.post("/despawn", json={"refs": [*refs, "cr-never-was"]}).json()
    kind = by_key(shard_process, SPAWN["key"])[0]["kind"]
    assert answer == {
        "removed": refs[1:],
        "absent": ["cr-never-was"],
        "refused": [refs[0]],
        "reasons": {refs[0]: f"the {kind} is in combat"},  # why, for the row's own error
    }
    assert refs_of(by_key(shard_process, SPAWN["key"])) == [refs[0]]
    assert shard_process.get("/health").status_code == 200, "a stuck creature is no outage"


def test_stuck_by_kind_holds_every_creature_of_that_kind_until_the_faults_are_cleared(shard_process):
    refs = refs_of(spawn(shard_process)["creatures"])
    kind = by_key(shard_process, SPAWN["key"])[0]["kind"]
    shard_process.post("/faults", json={"stuck": [kind]})
    assert shard_process.post("/despawn", json={"refs": refs}).json()["refused"] == refs
    shard_process.delete("/faults")
    assert shard_process.post("/despawn", json={"refs": refs}).json() == {"removed": refs, "absent": [], "refused": []}


def test_latency_holds_the_answer_back_after_the_work_is_done(shard_process):
    shard_process.post("/faults", json={"latency_ms": 300})
    with pytest.raises(httpx.ReadTimeout):
        shard_process.post("/spawn", json=SPAWN, timeout=0.1)
    shard_process.delete("/faults")
    # The client gave up, but the spawn landed.
    assert len(by_key(shard_process, SPAWN["key"])) == 3


def test_latency_delays_game_routes_but_not_harness_routes(shard_process):
    shard_process.post("/faults", json={"latency_ms": 300})
    started = time.monotonic()
    assert shard_process.get("/health").status_code == 200
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert shard_process.get("/faults").status_code == 200
    assert time.monotonic() - started < 0.3


def test_error_rate_1_answers_503_to_game_routes_and_does_nothing(shard_process):
    shard_process.post("/faults", json={"error_rate": 1.0})
    response = shard_process.post("/spawn", json=SPAWN)
    assert response.status_code == 503
    assert "injected" in response.json()["error"]
    assert response.headers["x-boot-id"] == shard_process.boot_id
    assert shard_process.get("/health").status_code == 503
    assert shard_process.post("/drift", json={"spawner": "orc-camp", "rate": 2}).status_code == 200
    shard_process.post("/faults", json={"error_rate": 0})
    assert by_key(shard_process, SPAWN["key"]) == []


def test_down_refuse_resets_game_connections_without_an_answer(shard_process):
    shard_process.post("/faults", json={"down": "refuse"})
    for method, path, body in (("GET", "/health", None), ("POST", "/spawn", SPAWN)):
        with pytest.raises(httpx.TransportError):
            shard_process.request(method, path, json=body, timeout=2)
    assert shard_process.get("/faults").json()["down"] == "refuse"  # still steerable
    shard_process.post("/faults", json={"down": False})
    assert shard_process.get("/health").status_code == 200
    assert by_key(shard_process, SPAWN["key"]) == []


def test_down_503_answers_503_to_game_routes_and_the_harness_brings_it_back(shard_process):
    shard_process.post("/faults", json={"down": "503"})
    for method, path, body in (("GET", "/health", None), ("POST", "/spawn", SPAWN)):
        response = shard_process.request(method, path, json=body)
        assert response.status_code == 503
        assert response.json() == {"error": "the shard is down"}
        assert response.headers["x-boot-id"] == shard_process.boot_id
    shard_process.post("/faults", json={"down": False})
    assert shard_process.get("/health").status_code == 200
    assert by_key(shard_process, SPAWN["key"]) == []


def test_a_restart_keeps_the_faults(shard_process):
    shard_process.post("/faults", json={"down": "503"})
    assert shard_process.post("/restart").status_code == 200
    assert shard_process.get("/health").status_code == 503


def test_drift_changes_a_rate_behind_the_engines_back(shard_process):
    response = shard_process.post("/drift", json={"spawner": "orc-camp", "rate": 7.5})
    assert response.status_code == 200
    assert response.json() == {"name": "orc-camp", "rate": 7.5, "previous": 1.0}
    assert rate(shard_process, "orc-camp") == 7.5
    conditional = shard_process.put("/spawners/orc-camp", json={"rate": 1, "expected": 4})
    assert conditional.status_code == 409
    assert conditional.json()["current"] == 7.5


def test_drift_creates_a_spawner_that_did_not_exist_yet(shard_process):
    assert shard_process.get("/spawners/bat-cave").status_code == 404
    response = shard_process.post("/drift", json={"spawner": "bat-cave", "rate": 3})
    assert response.json() == {"name": "bat-cave", "rate": 3.0, "previous": None}
    assert rate(shard_process, "bat-cave") == 3.0


# -- the process -------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_manage_command_serves_prints_its_url_and_boot_id_and_stops_cleanly(sig):
    with start_shard(via="manage") as shard:
        assert shard.url.startswith("http://127.0.0.1:")
        assert shard.get("/health").json()["boot_id"] == shard.boot_id
        assert shard.stop(sig) == 0
        assert "sandbox shard stopped" in shard.stdout()
        assert shard.stdout().count("listening on") == 1


def test_the_manage_command_refuses_a_negative_save_interval():
    result = subprocess.run(
        [sys.executable, "manage.py", "sandbox_shard", "--save-every", "-1"],
        cwd=ROOT,
        env={"DEBUG": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "--save-every" in result.stderr


def test_a_second_shard_on_a_port_in_use_says_so(shard_process):
    port = urlsplit(shard_process.url).port
    result = subprocess.run(
        [sys.executable, "-m", "eventsite.sandbox.shard", "--port", str(port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
