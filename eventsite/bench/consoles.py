"""A thousand consoles waiting at once: the production recipe under consoles that long-poll
the change feed and follow its event stream, while others read /healthz and the ledger.

    .venv/bin/python -m eventsite.bench.consoles [--polls 1000] [--streams 200] [--workers 2]
        [--pool 1] [--changes 20] [--every 3] [--port 8400] [--json]

It works in its own database (``BENCH_DATABASE_URL``, else ``eventsite_bench_consoles`` on
the local PostgreSQL), made afresh and migrated; seeds runs, a ledger and one user and
token per 10 consoles; starts the README's recipe (gunicorn with uvicorn's workers, and a
django-q2 cluster so that /healthz is ok) and then, from one asyncio process with raw
HTTP/1.1 (no client library in the way):

- ``--polls`` consoles, each on its own connection, read ``changes/?after=ID&wait=30``
  again and again, reading on from the highest id each was answered;
- ``--streams`` followers hold ``Accept: text/event-stream`` on the same feed;
- a prober reads ``/healthz`` and a ledger list (``resources/?page_size=50``) in turn,
  four times a second;
- a writer, once every console has read what the feed held (the site's cluster writes to
  it meanwhile: a backlog every console reads first, timed apart), commits ``--changes``
  run log entries ``--every`` seconds apart, each numbered; each console and follower
  notes when it is told of each.

It samples the site's PostgreSQL connections (those named ``eventsite-web``) every
0.2 s, and prints the latency from a commit to each console told of it (median, p95, max,
and how many were told within 1 s), the prober's p95s, the most connections seen, the
answers by status, the machine's load, and the processor time the web server used while
the changes were told (``site_cpu_percent``: 100 is one core busy throughout).
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent.parent
APP_NAME = "eventsite-web"
USERS_PER = 10


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def cpu_seconds(root: int) -> float:
    """The processor time (user and system) used so far by process ``root`` and every
    process under it that is alive (a gunicorn master and its workers), from ``/proc``."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command may hold spaces and parentheses: the fields follow its last ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        pid, parent = int(entry), int(fields[1])
        children.setdefault(parent, []).append(pid)
        times[pid] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def database_url() -> str:
    return os.environ.get("BENCH_DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/eventsite_bench_consoles"


def fresh_database(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def site_env(url: str, pool: int, app_name: str = APP_NAME, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SECURE_", "DJANGO_SETTINGS"))},
        "DJANGO_SETTINGS_MODULE": "eventsite.settings",
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "127.0.0.1",
        "DATABASE_URL": url + "?application_name=" + app_name,
        "DATABASE_POOL_MAX_SIZE": str(pool),
        "LOG_LEVEL": "WARNING",
        "Q_WORKERS": "1",
        **extra,
    }


SEED = """
import sys
from django.contrib.auth.models import Permission, User
from cleanup.api.tokens import issue
from cleanup.models import Resource, Run, RunStatus
from cleanup.tasks import ensure_schedule
ensure_schedule()
runs = [Run.objects.create(name=f"raid {i}", status=RunStatus.RUNNING) for i in range(20)]
Resource.objects.bulk_create(
    [Resource(run=run, module="sandbox", kind="creature", ref=f"orc-{run.pk}-{n}") for run in runs for n in range(50)]
)
perms = Permission.objects.filter(
    content_type__app_label="cleanup", codename__in=["view_runlog", "view_moduleevent", "view_run", "view_resource"]
)
for i in range(int(sys.argv[1])):
    user = User.objects.create_user(f"console{i}", is_staff=True)
    user.user_permissions.add(*perms)
    print(issue(user)[1], flush=True)
print("run", runs[0].pk)
"""


class Http:
    """One HTTP/1.1 keep-alive connection, as a console holds one."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def send(self, path: str, headers: dict[str, str]) -> None:
        if self.writer is None:
            await self.open()
        assert self.writer is not None
        lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        self.writer.write("\r\n".join(lines).encode())
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        assert self.reader is not None
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("closed")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = (await self.reader.readline()).decode().rstrip("\r\n")
            if not line:
                return status, headers
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()

    async def body(self, headers: dict[str, str]) -> bytes:
        assert self.reader is not None
        if "content-length" in headers:
            return await self.reader.readexactly(int(headers["content-length"]))
        chunks = []
        async for chunk in self.chunks():
            chunks.append(chunk)
        return b"".join(chunks)

    async def chunks(self) -> AsyncIterator[bytes]:
        assert self.reader is not None
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                await self.reader.readline()
                return
            data = await self.reader.readexactly(size)
            await self.reader.readexactly(2)
            yield data

    async def get(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        await self.send(path, headers)
        status, response_headers = await self.head()
        return status, response_headers, await self.body(response_headers)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Consoles:
    """One load-generating process's share of the consoles: every ``clients``-th long poll
    and stream, from ``share`` on. It keeps its standing in ``status`` (three numbers:
    long polls sent once, streams held, the lowest id any of its consoles has read to),
    and when ``stop`` is set, puts what each console was told, and when, on ``results``."""

    def __init__(self, args: argparse.Namespace, tokens: list[str], share: int, after: int) -> None:
        self.args = args
        self.tokens = tokens
        self.share = share
        self.after = after
        self.polls = range(share, args.polls, args.clients)
        self.streams = range(share, args.streams, args.clients)
        # (kind, console number) -> change number -> [times told, monotonic time first told]
        self.seen: dict[tuple[str, int], dict[int, list[float]]] = {}
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.read_to: dict[tuple[str, int], int] = {}
        self.sent = 0
        self.held = 0
        self.stopping = False

    def note(self, who: str, number: int, entry: dict[str, object]) -> None:
        detail = entry.get("detail")
        if not isinstance(detail, dict) or "bench" not in detail:
            return
        told = self.seen.setdefault((who, number), {}).setdefault(int(detail["bench"]), [0, time.monotonic()])
        told[0] += 1

    async def poll(self, number: int) -> None:
        token = self.tokens[number // USERS_PER]
        http = Http(self.args.port)
        after, first = self.after, True
        while not self.stopping:
            try:
                await http.send(
                    f"/api/v1/events/changes/?after={after}&wait=30",
                    {"Authorization": f"Token {token}", "Accept": "application/json"},
                )
                if first:
                    self.sent += 1
                    first = False
                status, headers = await http.head()
                body = await http.body(headers)
                self.statuses[f"poll {status}"] += 1
                if status != 200:
                    await asyncio.sleep(1)
                    continue
                for entry in json.loads(body):
                    self.note("poll", number, entry)
                    after = max(after, entry["id"])
                self.read_to["poll", number] = after
            except (ConnectionError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
                self.errors[f"poll {type(exc).__name__}"] += 1
                http.close()
                await asyncio.sleep(0.5)

    async def follow(self, number: int) -> None:
        token = self.tokens[(self.args.polls + number) // USERS_PER % len(self.tokens)]
        last = self.after
        while not self.stopping:
            http = Http(self.args.port)
            try:
                await http.send(
                    f"/api/v1/events/changes/?after={last}",
                    {"Authorization": f"Token {token}", "Accept": "text/event-stream"},
                )
                status, headers = await http.head()
                self.statuses[f"stream {status}"] += 1
                if status != 200:
                    await http.body(headers)
                    await asyncio.sleep(1)
                    continue
                self.held += 1
                buffer = b""
                try:
                    async for chunk in http.chunks():
                        buffer += chunk
                        while b"\n\n" in buffer:
                            block, buffer = buffer.split(b"\n\n", 1)
                            fields = dict(line.split(": ", 1) for line in block.decode().splitlines() if ": " in line)
                            if fields.get("event") == "change":
                                self.note("stream", number, json.loads(fields["data"]))
                                last = int(fields["id"])
                                self.read_to["stream", number] = last
                        if self.stopping:
                            return
                finally:
                    self.held -= 1
            except (ConnectionError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
                self.errors[f"stream {type(exc).__name__}"] += 1
                await asyncio.sleep(0.5)
            finally:
                http.close()

    async def main(self, status: Any, stop: Any) -> dict[str, object]:
        tasks = [asyncio.create_task(self.poll(i)) for i in self.polls]
        tasks += [asyncio.create_task(self.follow(i)) for i in self.streams]
        consoles = [("poll", i) for i in self.polls] + [("stream", i) for i in self.streams]
        while not stop.is_set():
            status[0], status[1] = self.sent, self.held
            status[2] = min((self.read_to.get(console, self.after) for console in consoles), default=2**62)
            await asyncio.sleep(0.2)
        self.stopping = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {
            "seen": [
                [kind, number, [[c, n, t] for c, (n, t) in told.items()]] for (kind, number), told in self.seen.items()
            ],
            "statuses": dict(self.statuses),
            "errors": dict(self.errors),
        }


def run_consoles(args: argparse.Namespace, tokens: list[str], share: int, after: int, status: Any, stop: Any,
                 results: Any) -> None:  # fmt: skip
    results.put(asyncio.run(Consoles(args, tokens, share, after).main(status, stop)))


async def probe(port: int, token: str, stop: Any) -> dict[str, list[Any]]:
    """``/healthz`` and a ledger page in turn, four times a second, until ``stop``: each
    answer's time from the request's first byte to the response's last."""
    http = Http(port)
    probes: dict[str, list[Any]] = {"healthz": [], "ledger": [], "statuses": [], "errors": []}
    probes.update({"healthz_at": [], "ledger_at": []})
    while not stop.is_set():
        for name, path in (("healthz", "/healthz"), ("ledger", "/api/v1/events/resources/?page_size=50")):
            started = time.monotonic()
            try:
                status, _, _ = await http.get(path, {"Authorization": f"Token {token}"})
            except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
                probes["errors"].append(f"probe {type(exc).__name__}")
                http.close()
                continue
            probes[name].append(time.monotonic() - started)
            probes[f"{name}_at"].append(started)
            probes["statuses"].append(f"{name} {status}")
            await asyncio.sleep(0.125)
    return probes


def run_prober(port: int, token: str, stop: Any, results: Any) -> None:
    results.put(asyncio.run(probe(port, token, stop)))


class Bench:
    """The conductor: starts ``--clients`` processes of consoles and a prober process of its
    own (so that neither's latency includes the other's turn on an event loop), waits for
    the consoles to read the backlog, commits the changes, and gathers what each was told."""

    def __init__(self, args: argparse.Namespace, tokens: list[str], run_id: int, url: str, site: int = 0) -> None:
        self.args = args
        self.site = site  # the web server's process, whose processor time is measured
        self.tokens = tokens
        self.run_id = run_id
        self.url = url
        self.committed: dict[int, float] = {}
        self.connections: list[int] = []
        self.stop = asyncio.Event()
        self.site_cpu = (0.0, 1.0)
        processes = multiprocessing.get_context("fork")
        self.statuses = [processes.Array("q", 3, lock=False) for _ in range(args.clients)]
        self.stop_consoles = processes.Event()
        self.stop_prober = processes.Event()
        self.results: Any = processes.Queue()
        self.probe_results: Any = processes.Queue()
        self.processes = processes

    async def count_connections(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                cursor = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]
                )
                row = await cursor.fetchone()
                self.connections.append(row[0] if row else 0)
                await asyncio.sleep(0.2)

    async def position(self) -> int:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            # The highest place an entry holds (the sequence's own may be past it: places skip).
            row = await (
                await conn.execute(
                    "SELECT greatest((SELECT max(seq) FROM cleanup_runlog),"
                    " (SELECT max(seq) FROM cleanup_moduleevent), 0)"
                )
            ).fetchone()
            return int(row[0]) if row else 0

    async def caught_up(self, start: int, limit_s: float) -> tuple[int, float | None]:
        """Wait until every console has read up to where the feed stands (the site and its
        cluster write to it too: a backlog every console reads first), until it stands
        still; answers the backlog's size and how long the consoles took to read it."""
        began = time.monotonic()
        while time.monotonic() - began < limit_s:
            standing = await self.position()
            if all(status[2] >= standing for status in self.statuses):
                await asyncio.sleep(2)
                if await self.position() == standing:
                    return standing - start, time.monotonic() - began - 2
            await asyncio.sleep(0.5)
        return await self.position() - start, None

    async def write(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            for change in range(self.args.changes):
                await conn.execute(
                    "INSERT INTO cleanup_runlog (run_id, kind, at, detail) VALUES (%s, 'run.started', now(), %s)",
                    [self.run_id, json.dumps({"bench": change})],
                )
                self.committed[change] = time.monotonic()
                await asyncio.sleep(self.args.every)

    async def gathered(self, queue: Any, count: int) -> list[Any]:
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(None, queue.get, True, 120) for _ in range(count)]

    async def main(self, after: int) -> dict[str, object]:
        args = self.args
        clients = [
            self.processes.Process(
                target=run_consoles,
                args=(args, self.tokens, share, after, self.statuses[share], self.stop_consoles, self.results),
            )
            for share in range(args.clients)
        ]
        for client in clients:
            client.start()
        counting = asyncio.create_task(self.count_connections())
        # Everyone connects first (the authentication of a thousand requests), then waits.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sum(s[1] for s in self.statuses) >= args.streams and sum(s[0] for s in self.statuses) >= args.polls:
                break
            await asyncio.sleep(0.5)
        # The last long polls sent are checked (token, permissions) and parked, and every
        # console reads the backlog; what is measured is how each change is told after that.
        backlog, caught_up_s = await self.caught_up(after, 180)
        await asyncio.sleep(3)
        prober = self.processes.Process(
            target=run_prober, args=(args.port, self.tokens[-1], self.stop_prober, self.probe_results)
        )
        prober.start()
        load_before = os.getloadavg()
        cpu_before, began = cpu_seconds(self.site), time.monotonic()
        await self.write()
        await asyncio.sleep(3)
        load_after = os.getloadavg()
        self.site_cpu = (cpu_seconds(self.site) - cpu_before, time.monotonic() - began)
        self.stop_prober.set()
        self.stop_consoles.set()
        probes = (await self.gathered(self.probe_results, 1))[0]
        shares = await self.gathered(self.results, args.clients)
        self.stop.set()
        await asyncio.gather(counting, return_exceptions=True)
        for process in [*clients, prober]:
            process.join(10)
        return self.summary(shares, probes, backlog, caught_up_s, load_before, load_after)

    def slow(self, probes: dict[str, list[Any]]) -> list[tuple[str, int, int]]:
        commits = sorted(self.committed.values())
        found = []
        for name in ("healthz", "ledger"):
            for took, at in zip(probes[name], probes[f"{name}_at"], strict=True):
                if took > 0.2:
                    # After the last change committed before it was sent (-1: before the first).
                    since = min((at - c for c in commits if c <= at), default=-1.0)
                    found.append((name, round(1000 * took), round(1000 * since)))
        return found

    def summary(self, shares: list[Any], probes: dict[str, list[Any]], backlog: int, caught_up_s: float | None,
                load_before: Any, load_after: Any) -> dict[str, object]:  # fmt: skip
        expected = self.args.changes
        told: dict[str, list[float]] = {"poll": [], "stream": []}
        complete: Counter[str] = Counter()
        repeats = 0
        statuses: Counter[str] = Counter(probes["statuses"])
        errors: Counter[str] = Counter(probes["errors"])
        for share in shares:
            statuses.update(share["statuses"])
            errors.update(share["errors"])
            for kind, _number, changes in share["seen"]:
                complete[kind] += len(changes) == expected
                for change, times, first in changes:
                    repeats += times - 1
                    if change in self.committed:
                        told[kind].append(first - self.committed[change])
        result: dict[str, object] = {"changes": expected, "backlog": backlog, "backlog_read_s": caught_up_s}
        for kind, values in told.items():
            result[f"{kind}_told"] = len(values)
            result[f"{kind}_median_s"] = statistics.median(values) if values else None
            result[f"{kind}_p95_s"] = percentile(values, 0.95)
            result[f"{kind}_max_s"] = max(values) if values else None
            result[f"{kind}_within_1s"] = sum(1 for v in values if v <= 1.0)
        result.update(
            {
                "polls_told_every_change": complete["poll"],
                "streams_told_every_change": complete["stream"],
                "repeats": repeats,
                "healthz_p95_ms": round(1000 * (percentile(probes["healthz"], 0.95) or 0), 1),
                "ledger_p95_ms": round(1000 * (percentile(probes["ledger"], 0.95) or 0), 1),
                "healthz_median_ms": round(1000 * statistics.median(probes["healthz"] or [0]), 1),
                "ledger_median_ms": round(1000 * statistics.median(probes["ledger"] or [0]), 1),
                "probes": {k: len(probes[k]) for k in ("healthz", "ledger")},
                # Each probe over 200 ms: how long, and how long after the last change it was sent.
                "slow_probes": self.slow(probes),
                "db_connections_max": max(self.connections or [0]),
                "statuses": dict(statuses),
                "errors": dict(errors),
                "load_before": [round(x, 1) for x in load_before],
                "load_after": [round(x, 1) for x in load_after],
                # The web server's processor time while the changes were told (100: one core).
                "site_cpu_s": round(self.site_cpu[0], 2),
                "site_cpu_percent": round(100 * self.site_cpu[0] / self.site_cpu[1], 1),
            }
        )
        return result


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=1)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--every", type=float, default=3.0)
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--clients", type=int, default=2, help="processes the consoles are shared among")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--logs", default="/tmp")
    args = parser.parse_args()

    url = database_url()
    fresh_database(url)
    python = sys.executable
    env = site_env(url, args.pool)
    logs = Path(args.logs)
    subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    users = (args.polls + args.streams) // USERS_PER + 2
    seeded = subprocess.run(
        [python, "manage.py", "shell", "-c", SEED.replace("int(sys.argv[1])", str(users))],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    run_id = int(seeded[-1])
    tokens = [t for t in seeded[:-2] if re.fullmatch(r"[0-9a-f]{64}", t)]
    assert len(tokens) == users, seeded
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(last), 0) FROM cleanup_feedsequence").fetchone()
        after = int(row[0]) if row else 0
    gunicorn = [
        python, "-m", "gunicorn", "eventsite.asgi:application", "--worker-class", "uvicorn_worker.UvicornWorker",
        "--bind", f"127.0.0.1:{args.port}", "--workers", str(args.workers), "--backlog", "4096",
    ]  # fmt: skip
    web = start(gunicorn, env, logs / "bench-consoles-web.log")
    cluster = start(
        [python, "manage.py", "qcluster"], site_env(url, 1, "eventsite-cluster"), logs / "bench-consoles-cluster.log"
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                import httpx

                if httpx.get(f"http://127.0.0.1:{args.port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        bench = Bench(args, tokens, run_id, url, web.pid)
        result = asyncio.run(bench.main(after))
    finally:
        stop(web)
        stop(cluster)
    result["options"] = vars(args)
    result["machine"] = {"nproc": os.cpu_count()}
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
