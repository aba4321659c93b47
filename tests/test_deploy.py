"""The deploy kit (`deploy/`), proven without a Docker engine.

`compose.yaml` and the `Dockerfile` are parsed and checked against the relay's own settings,
port and health path. The Dockerfile's exact `CMD`, with its `ENV` and the relay's compose
environment, is started against a real PostgreSQL and must serve `/healthz`, NIP-11 and a
websocket client; the `HEALTHCHECK` command is run against it. The `engram` commands in
`deploy/README.md` must parse with the real CLI.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import msgspec
import pytest
import websockets
import yaml
from relay_fixtures import create_database_sync, free_port

from engram.nip01 import Event, sign_event
from relay.config import ENV_PREFIX, Limits, Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
TIMEOUT = 30.0  # an outer bound for one reply or condition on a loaded machine
SECKEY = hashlib.sha256(b"engram-relay deploy kit test").digest()
TEST_PASSWORD = "0123456789abcdef"  # stands in for POSTGRES_PASSWORD when interpolating
TENANT_HOST = "relay.example.com"


# --- Dockerfile -----------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [rest for name, rest in self.instructions if name == instruction]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for rest in self.args("ENV"):
            out.update(_parse_env(rest))
        return out


def _logical_lines(text: str) -> list[str]:
    """Instructions with line continuations joined; comments and blank lines dropped."""
    lines: list[str] = []
    buf: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        lines.append(" ".join(buf))
        buf = []
    if buf:
        lines.append(" ".join(buf))
    return lines


def _substitute(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m[1] or m[2], m[0]), text)


def _parse_env(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if "=" not in words[0]:  # legacy `ENV KEY value with spaces`
        key, value = rest.split(None, 1)
        return {key: value}
    return dict(w.split("=", 1) for w in words)


@functools.cache
def dockerfile_stages() -> tuple[Stage, ...]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines((DEPLOY / "Dockerfile").read_text()):
        name, _, rest = line.partition(" ")
        name, rest = name.upper(), rest.strip()
        if name == "ARG" and not stages:
            key, _, value = rest.partition("=")
            global_args[key] = value
        elif name == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(_substitute(words[0], global_args), alias))
        else:
            assert stages, f"{name} before the first FROM"
            stages[-1].instructions.append((name, rest))
    return tuple(stages)


def final_stage() -> Stage:
    return dockerfile_stages()[-1]


def image_cmd() -> list[str]:
    (rest,) = final_stage().args("CMD")
    assert rest.startswith("["), "CMD must be exec form (a JSON list), so the relay is PID 1"
    return json.loads(rest)


def image_healthcheck() -> tuple[dict[str, str], list[str]]:
    (rest,) = final_stage().args("HEALTHCHECK")
    options: dict[str, str] = {}
    while rest.startswith("--"):
        option, _, rest = rest.partition(" ")
        key, _, value = option[2:].partition("=")
        options[key] = value
        rest = rest.strip()
    kind, _, command = rest.partition(" ")
    assert kind.upper() == "CMD", "HEALTHCHECK must run a command"
    assert command.startswith("["), "HEALTHCHECK CMD must be exec form"
    return options, json.loads(command)


def image_port() -> int:
    (exposed,) = final_stage().args("EXPOSE")
    return int(exposed.split("/")[0])


def setting_env_names() -> set[str]:
    """Every environment variable `load_settings` reads."""
    names = {ENV_PREFIX + "CONFIG"}
    for f in msgspec.structs.fields(Settings):
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):  # a table
            table = f.type.__struct_fields__
            names |= {f"{ENV_PREFIX}{f.name.upper()}_{sub.upper()}" for sub in table}
        else:
            names.add(ENV_PREFIX + f.name.upper())
    assert f"{ENV_PREFIX}LIMITS_{Limits.__struct_fields__[0].upper()}" in names
    return names


def _dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [p.strip().lstrip("/") for p in lines if p.strip() and not p.startswith("#")]


def dockerignored(path: str) -> bool:
    """Whether `.dockerignore` keeps `path` (relative to the repository) out of the context.

    Close enough to Docker's matching for these checks: `*` may also match `/` here, which
    only makes "is not ignored" assertions stricter.
    """
    from fnmatch import fnmatchcase

    parts = path.split("/")
    suffixes = ["/".join(parts[i:]) for i in range(len(parts))]
    ignored = False
    for pattern in _dockerignore_patterns():
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        if pattern.startswith("**/"):
            tail = pattern[3:]
            hit = any(fnmatchcase(p, tail) for s in suffixes for p in _prefixes(s))
        else:
            hit = any(fnmatchcase(p, pattern) for p in _prefixes(path))
        if hit:
            ignored = not negated
    return ignored


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# --- compose.yaml ---------------------------------------------------------------------


class MissingVariable(KeyError):
    pass


_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")
_EXPR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])(.*))?", re.S)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution (`${X}`, `${X:-d}`, `${X-d}`, `${X:?e}`, `$$`)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        expr = _EXPR.fullmatch(m["braced"] if m["braced"] is not None else m["plain"])
        assert expr, f"unsupported substitution {m[0]}"
        name, op, arg = expr.groups()
        current = env.get(name)
        if op == ":-":
            return current or arg
        if op == "-":
            return arg if current is None else current
        if op in (":?", "?") and (current is None or (op == ":?" and not current)):
            raise MissingVariable(f"{name}: {arg}")
        return current or ""

    return _VAR.sub(one, value)


@functools.cache
def compose_raw() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as compose sees it with `env` (default: only POSTGRES_PASSWORD set)."""
    return interpolate(compose_raw(), {"POSTGRES_PASSWORD": TEST_PASSWORD} if env is None else env)


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def container_ports(service: dict[str, Any]) -> list[int]:
    ports = []
    for spec in service.get("ports") or ():
        if isinstance(spec, dict):
            ports.append(int(spec["target"]))
        else:
            ports.append(int(str(spec).rsplit(":", 1)[-1].split("/")[0]))
    return ports


def postgres_options(service: dict[str, Any]) -> dict[str, str]:
    command = service["command"]
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    options = {}
    for flag, setting in itertools.pairwise(words):
        if flag == "-c":
            key, _, value = setting.partition("=")
            options[key] = value
    return options


def _bytes(size: str) -> int:
    m = re.fullmatch(r"(\d+)(kB|MB|GB)", size)
    assert m, f"not a PostgreSQL memory size: {size}"
    return int(m[1]) * {"kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[m[2]]


# --- the image's CMD, run here --------------------------------------------------------


def engram_script() -> str:
    beside = Path(sys.executable).with_name("engram")
    found = str(beside) if beside.exists() else shutil.which("engram")
    assert found, "the engram console script of this environment is not installed"
    return found


def image_env(database_url: str, port: int) -> dict[str, str]:
    """The container's environment: the Dockerfile's ENV, then compose's `environment:`.

    PATH stays this environment's (its `engram` is the image's /opt/venv/bin/engram), the
    database is a fresh one on the test server, and the port a free one (a container has
    its network to itself; tests share one).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update({k: v for k, v in final_stage().env().items() if k != "PATH"})
    env.update(service_env(compose()["services"]["relay"]))
    env[ENV_PREFIX + "DATABASE_URL"] = database_url
    env[ENV_PREFIX + "PORT"] = str(port)
    return env


@dataclass
class ImageRelay:
    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    log_path: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def _http_get(url: str, headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5, **kw) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode()


def _wait_healthy(relay: ImageRelay, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if relay.proc.poll() is not None:
            raise RuntimeError(f"relay exited with {relay.proc.returncode}:\n{relay.log()}")
        try:
            if _http_get(relay.http + "/healthz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"relay did not answer /healthz:\n{relay.log()}")


def start_image_cmd(pg_server_url: str, tmp: Path) -> ImageRelay:
    """The Dockerfile's exact CMD, as the image would run it, on a fresh database."""
    cmd = image_cmd()
    assert cmd[0] == "engram"
    port = free_port()
    env = image_env(create_database_sync(pg_server_url), port)
    log_path = tmp / f"image-relay-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [engram_script(), *cmd[1:]],
            cwd=tmp,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    relay = ImageRelay(proc, port, env, log_path)
    try:
        _wait_healthy(relay)
    except BaseException:
        relay.stop()
        raise
    return relay


def run_healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """The HEALTHCHECK command; `python` is the image's venv Python, here this one."""
    _, command = image_healthcheck()
    if command[0] == "python":
        command = [sys.executable, *command[1:]]
    return subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)


def run_engram(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`docker compose exec relay engram ARGS`: the container's environment, its script."""
    return subprocess.run(
        [engram_script(), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def image_relay(
    pg_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageRelay]:
    relay = start_image_cmd(pg_server_url, tmp_path_factory.mktemp("image"))
    yield relay
    relay.stop()


def _event(kind: int = 1, tags: list[list[str]] | None = None, content: str = "hi") -> Event:
    return sign_event(SECKEY, int(time.time()), kind, tags or [], content, bytes(32))


def _frame(verb: str, event: Event) -> str:
    return f'["{verb}",{msgspec.json.encode(event).decode()}]'


async def _recv(ws: Any) -> list[Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def _publish_and_read_back(ws: Any) -> None:
    # no AUTH greeting (auth_challenge "when-needed"): the first frame answers the EVENT
    event = _event(content=f"hi from the deploy kit {uuid.uuid4()}")
    await ws.send(_frame("EVENT", event))
    assert await _recv(ws) == ["OK", event.id, True, ""]
    await ws.send(json.dumps(["REQ", "back", {"ids": [event.id]}]))
    stored = await _recv(ws)
    assert stored[:2] == ["EVENT", "back"] and stored[2]["id"] == event.id
    assert await _recv(ws) == ["EOSE", "back"]


# --- compose.yaml ---------------------------------------------------------------------


def test_compose_relay_service_matches_relay_and_dockerfile() -> None:
    services = compose()["services"]
    relay, postgres = services["relay"], services["postgres"]

    build = relay["build"]
    assert (DEPLOY / build["context"]).resolve() == REPO
    assert (REPO / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
    assert relay["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert relay["restart"] in ("unless-stopped", "always")

    # the published container port is the image's EXPOSE and the relay's default port
    assert container_ports(relay) == [image_port()] == [Settings().port]

    # every ENGRAM_* variable is a setting the relay reads, and together they load
    env = service_env(relay)
    assert set(env) - setting_env_names() == set(), "compose names a setting that doesn't exist"
    settings = load_settings(env={**final_stage().env(), **env})
    url = urlsplit(settings.database_url or "")
    pg_env = service_env(postgres)
    assert url.scheme in ("postgresql", "postgres")
    assert url.hostname in services  # the compose service name resolves on its network
    assert url.port == 5432
    assert url.username == pg_env["POSTGRES_USER"]
    assert url.password == pg_env["POSTGRES_PASSWORD"] == TEST_PASSWORD
    assert url.path == "/" + pg_env["POSTGRES_DB"]
    assert (settings.host, settings.port) == ("0.0.0.0", image_port())


def test_compose_requires_a_postgres_password() -> None:
    with pytest.raises(MissingVariable, match="POSTGRES_PASSWORD"):
        compose({})
    compose({"POSTGRES_PASSWORD": "x"})  # and nothing else is required


def test_compose_postgres_healthcheck_and_volume() -> None:
    doc = compose()
    postgres = doc["services"]["postgres"]
    assert postgres["image"].startswith("postgres:17")
    env = service_env(postgres)

    check = postgres["healthcheck"]["test"]
    assert check[0] == "CMD"
    words = check[1:]
    assert words[0] == "pg_isready"
    assert words[words.index("-h") + 1] == "127.0.0.1"  # TCP: not the init-time socket server
    assert words[words.index("-U") + 1] == env["POSTGRES_USER"]
    assert words[words.index("-d") + 1] == env["POSTGRES_DB"]

    named = set(doc.get("volumes") or {})
    mounts = [str(v).split(":") for v in postgres["volumes"]]
    assert ["pgdata", "/var/lib/postgresql/data"] in mounts and "pgdata" in named


async def test_compose_postgres_settings_exist_and_fit_2gb(pg_server_url: str) -> None:
    import asyncpg

    options = postgres_options(compose()["services"]["postgres"])
    conn = await asyncpg.connect(pg_server_url)
    try:
        rows = await conn.fetch(
            "SELECT name, unit FROM pg_settings WHERE name = ANY($1::text[])", list(options)
        )
    finally:
        await conn.close()
    units = {r["name"]: r["unit"] for r in rows}
    assert set(options) - set(units) == set(), "unknown PostgreSQL settings"
    for name, value in options.items():
        if units[name] in ("8kB", "kB", "MB"):
            _bytes(value)  # a size with a unit PostgreSQL takes

    vm = 2 << 30
    assert _bytes(options["shared_buffers"]) <= vm // 4
    assert _bytes(options["shared_buffers"]) < _bytes(options["effective_cache_size"]) < vm
    assert _bytes(options["maintenance_work_mem"]) <= vm // 8
    assert _bytes(options["work_mem"]) * 16 <= vm // 8  # 16 busy sorts stay small
    assert options["synchronous_commit"] == "on"  # OK means committed, durably
    pool_max = int(service_env(compose()["services"]["relay"])["ENGRAM_DB_POOL_MAX"])
    assert int(options["max_connections"]) >= 2 * pool_max + 10


# --- Dockerfile -----------------------------------------------------------------------


def test_dockerfile_is_multistage_and_runs_unprivileged() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert final.base.startswith("python:") and "slim" in final.base
    assert builder.name and any(f"--from={builder.name}" in rest for rest in final.args("COPY")), (
        "the final stage copies the build result from the builder"
    )
    assert any("pip install" in rest for rest in builder.args("RUN"))
    # runtime deps only: nothing is built or installed in the final stage
    for rest in final.args("RUN"):
        assert not re.search(r"pip|apt-get|apk|gcc|build-essential", rest), rest

    users = final.args("USER")
    assert users, "the final stage must switch to a non-root user"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    if user.isdigit():
        assert int(user) > 0
    # the USER is in effect for CMD: nothing after it switches back
    names = [name for name, _ in final.instructions]
    assert names.index("CMD") > max(i for i, n in enumerate(names) if n == "USER")


def test_dockerfile_cmd_port_and_healthcheck_match_the_relay() -> None:
    cmd = image_cmd()
    assert cmd[:2] == ["engram", "serve"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert "--port" not in cmd and "--database-url" not in cmd  # from the environment
    assert "--data-dir" not in cmd  # the embedded server's place is ENGRAM_DATA_DIR (/data)

    env = final_stage().env()
    assert image_port() == Settings().port == int(env["ENGRAM_PORT"])
    assert set(k for k in env if k.startswith(ENV_PREFIX)) <= setting_env_names()
    settings = load_settings(env=env)
    assert (settings.host, settings.port) == ("0.0.0.0", image_port())

    options, command = image_healthcheck()
    script = " ".join(command)
    # health is readiness (database reachable, migrations applied), not liveness
    assert "http://127.0.0.1:" in script and "/readyz" in script and "/healthz" not in script
    assert "'ENGRAM_PORT', '7777'" in script  # follows ENGRAM_PORT, else the exposed port
    assert float(options["timeout"].rstrip("s")) > 4  # urlopen's own timeout is 4 s
    # the relay serves the path the HEALTHCHECK asks
    from relay.app import create_app

    paths = {getattr(r, "path", None) for r in create_app(Settings(), "postgresql://x").routes}
    assert "/readyz" in paths


def test_dockerfile_keeps_the_embedded_database_in_a_volume() -> None:
    """`docker run -v engram-data:/data IMAGE` without a database URL: the embedded
    PostgreSQL's cluster goes to the volume, which the relay's user may write."""
    final = final_stage()
    env = final.env()
    assert load_settings(env=env).data_dir == env["ENGRAM_DATA_DIR"] == "/data"
    assert "/data" in final.args("VOLUME") or '["/data"]' in final.args("VOLUME")
    user = final.args("USER")[-1]
    names = [name for name, _ in final.instructions]
    made = [i for i, (n, rest) in enumerate(final.instructions) if n == "RUN" and "/data" in rest]
    assert made and f"chown {user} /data" in final.instructions[made[0]][1]
    # a step after VOLUME could not change the directory a new volume is created from
    assert made[0] < names.index("VOLUME")


def test_dockerfile_copies_every_package_the_build_needs() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    needed = {"pyproject.toml", project["project"]["readme"], *packages}
    builder = dockerfile_stages()[0]
    sources: set[str] = set()
    for rest in builder.args("COPY"):
        words = [w for w in shlex.split(rest) if not w.startswith("--")]
        sources |= {w.rstrip("/") for w in words[:-1]}
    assert needed <= sources, f"not copied into the builder: {sorted(needed - sources)}"
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignored(source), f".dockerignore excludes {source}"
        if (REPO / source).is_dir():
            for path in (REPO / source).rglob("*.py"):
                rel = path.relative_to(REPO).as_posix()
                assert "__pycache__" in rel or not dockerignored(rel), rel
    assert not dockerignored("migrations/0001_init.sql")


def test_dockerignore_keeps_repository_junk_out() -> None:
    for path in (
        ".git",
        ".git/config",
        ".venv",
        "venv",
        "relay/__pycache__/app.cpython-312.pyc",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
        "engram_relay.egg-info",
        "tests",
        "deploy/.env",
    ):
        assert dockerignored(path), path


# --- the Dockerfile's CMD, run for real -----------------------------------------------


def test_image_cmd_serves_health_and_nip11(image_relay: ImageRelay) -> None:
    assert _http_get(image_relay.http + "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
    status, ctype, body = _http_get(image_relay.http + "/", {"Accept": "application/nostr+json"})
    assert status == 200 and ctype.startswith("application/nostr+json")
    doc = json.loads(body)
    assert doc["name"] == Settings().relay_name
    assert 11 in doc["supported_nips"]
    assert doc["limitation"]["max_message_length"] == Limits().max_message_length


def test_image_healthcheck_command(image_relay: ImageRelay) -> None:
    ok = run_healthcheck(image_relay.env)
    assert ok.returncode == 0, ok.stderr.decode()
    nobody = run_healthcheck({**image_relay.env, "ENGRAM_PORT": str(free_port())})
    assert nobody.returncode != 0  # and it reports unhealthy when nothing answers


async def test_image_cmd_serves_a_websocket_client(image_relay: ImageRelay) -> None:
    async with websockets.connect(image_relay.ws + "/") as ws:
        await _publish_and_read_back(ws)


def test_image_cmd_migrated_the_database(image_relay: ImageRelay) -> None:
    status = run_engram(image_relay.env, "db", "status")  # docker compose exec relay engram …
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines and all(line.endswith("\tapplied") for line in lines), status.stdout


def test_image_cmd_stops_cleanly_on_sigterm(pg_server_url: str, tmp_path: Path) -> None:
    relay = start_image_cmd(pg_server_url, tmp_path)
    started = time.monotonic()
    code = relay.stop()
    assert time.monotonic() - started < 10, "docker stop would have to SIGKILL it"
    assert code in (0, -signal.SIGTERM), relay.log()
    assert "Traceback" not in relay.log(), relay.log()


def test_readme_tenant_commands_against_the_image_cmd(pg_server_url: str, tmp_path: Path) -> None:
    """`docker compose exec relay engram tenant add …` as the README shows it, then NIP-11."""
    relay = start_image_cmd(pg_server_url, tmp_path)
    try:
        added = run_engram(relay.env, "tenant", "add", TENANT_HOST, "--name", "Example relay")
        assert added.returncode == 0, added.stderr
        listed = run_engram(relay.env, "tenant", "ls")
        assert listed.returncode == 0 and listed.stdout.startswith(TENANT_HOST), listed

        deadline = time.monotonic() + TIMEOUT
        nip11 = {"Accept": "application/nostr+json"}
        while True:
            status, _, body = _http_get(relay.http + "/", {**nip11, "Host": TENANT_HOST})
            if status == 200 and json.loads(body)["name"] == "Example relay":
                break
            assert time.monotonic() < deadline, f"tenant not picked up: {status} {body}"
            time.sleep(0.2)
        # another host name is unknown now, but the health check still answers on it
        assert _http_get(relay.http + "/", nip11)[0] == 404
        healthy = run_healthcheck(relay.env)
        assert healthy.returncode == 0, healthy.stderr.decode()
    finally:
        relay.stop()


# --- README ---------------------------------------------------------------------------


def readme_engram_commands() -> list[list[str]]:
    """Every `docker compose exec|run … relay engram …` line of deploy/README.md."""
    text = (DEPLOY / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            m = re.search(r"docker compose (?:exec|run --rm)(?: -T)? relay (engram .*)", line)
            if m:
                commands.append(shlex.split(m[1], comments=True))
    return commands


def test_readme_engram_commands_exist_with_their_options() -> None:
    import typer.main

    from cli.commands.main import app

    commands = readme_engram_commands()
    assert {tuple(c[1:3]) for c in commands} >= {("db", "status"), ("tenant", "add")}
    for words in commands:
        command: click.Command = typer.main.get_command(app)
        args = words[1:]
        while isinstance(command, click.Group) and args and args[0] in command.commands:
            command, args = command.commands[args[0]], args[1:]
        assert not isinstance(command, click.Group), f"not a command: {shlex.join(words)}"
        try:
            command.make_context(words[0], list(args))
        except click.ClickException as exc:
            pytest.fail(f"{shlex.join(words)}: {exc.format_message()}")


def test_readme_names_only_real_settings() -> None:
    text = (DEPLOY / "README.md").read_text()
    named = set(re.findall(r"\bENGRAM_[A-Z0-9_]*[A-Z0-9]\b", text))
    assert named - setting_env_names() == set()
    assert set(service_env(compose()["services"]["relay"])) <= named


# --- reverse proxy examples -----------------------------------------------------------


def test_proxy_examples_point_at_the_relay() -> None:
    caddyfile = (DEPLOY / "Caddyfile").read_text()
    m = re.search(r"reverse_proxy \{\$RELAY_UPSTREAM:([\w.-]+):(\d+)\}", caddyfile)
    assert m, "Caddyfile: reverse_proxy {$RELAY_UPSTREAM:service:port}"
    assert m[1] in compose()["services"] and int(m[2]) == image_port()

    nginx = (DEPLOY / "nginx.conf").read_text()
    published = compose()["services"]["relay"]["ports"][0]
    assert f"proxy_pass http://127.0.0.1:{published.rsplit(':', 2)[-2]};" in nginx
    for directive in (
        "proxy_http_version 1.1;",
        "proxy_set_header Upgrade $http_upgrade;",
        "proxy_set_header Connection $connection_upgrade;",
        "proxy_set_header Host $host;",
        "proxy_read_timeout 1h;",
    ):
        assert directive in nginx, directive


def test_the_relay_knows_its_public_url_and_keeps_metrics_to_the_operator() -> None:
    """Behind Caddy or nginx the operator sets ENGRAM_PUBLIC_URLS (compose passes it on,
    the proxy examples and deploy/README.md say so); Prometheus, by its service name, may
    read /metrics, and neither proxy passes /metrics on to the internet."""
    from relay.allowlist import parse_allowlist
    from relay.identity import parse_public_urls

    services = compose()["services"]
    env = service_env(services["relay"])
    assert load_settings(env=env).public_urls == []  # unset: the listening URL only
    public = "wss://relay.example.com"
    behind = compose({"POSTGRES_PASSWORD": TEST_PASSWORD, "ENGRAM_PUBLIC_URLS": public})
    settings = load_settings(env=service_env(behind["services"]["relay"]))
    assert parse_public_urls(settings.public_urls, "public_urls") == parse_public_urls(
        [public], "x"
    )
    _, names = parse_allowlist(load_settings(env=env).metrics_allow, "metrics_allow")
    assert "prometheus" in names and "prometheus" in services
    readme = (DEPLOY / "README.md").read_text()
    assert "ENGRAM_PUBLIC_URLS=wss://relay.example.com" in readme
    assert "behind a proxy, set the public url" in (REPO / "README.md").read_text().lower()
    for proxy in ("Caddyfile", "nginx.conf"):
        assert "ENGRAM_PUBLIC_URLS=" in (DEPLOY / proxy).read_text(), proxy
    assert "respond /metrics 404" in (DEPLOY / "Caddyfile").read_text()
    assert re.search(r"location = /metrics \{\s*return 404;", (DEPLOY / "nginx.conf").read_text())


def test_test_image_finds_the_virtualenv_sudo_dropped() -> None:
    """`sudo bash deploy/test-image` from a shell with the project's virtualenv active:
    sudo resets PATH and drops VIRTUAL_ENV; deploy/find-python (which the script sources)
    finds that virtualenv in its parent processes' environment."""
    venv = Path(sys.executable).parent.parent
    # like sudo: the environment reset, the caller's (with VIRTUAL_ENV) one process up
    script = f"env -i PATH=/usr/bin:/bin HOME=/nonexistent bash {DEPLOY / 'find-python'}; exit $?"
    found = subprocess.run(
        ["bash", "-c", script],
        env={**os.environ, "VIRTUAL_ENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(venv / "bin" / "python")
    assert 'source "$REPO/deploy/find-python"' in (DEPLOY / "test-image").read_text()


def test_readme_states_peers_as_they_are() -> None:
    """nostream serves kind-4 reads without AUTH (its own suite expects it): the README
    makes no claim that peers restrict them."""
    assert "as strfry and nostream restrict" not in (REPO / "README.md").read_text()
