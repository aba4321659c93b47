"""Operations: /metrics, /healthz and /readyz, the HTML page, configuration, logs, keygen.

Relays are real `engram serve` processes; the database outage is a TCP proxy in front of
the test PostgreSQL that the test cuts and restores.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest
from nostr_client import Client
from prometheus_client.parser import text_string_to_metric_families
from relay_fixtures import create_database_sync
from typer.testing import CliRunner

from cli.commands.main import app
from cli.commands.ops import masked, to_toml
from engram.nip01 import pubkey_of, sign_event
from engram.nip19 import decode
from relay import metrics, wire
from relay.config import ConfigError, Settings, load_settings
from relay.logs import JsonFormatter

AUX = bytes(32)
SK = (0x0E5E0000).to_bytes(32, "big")
ENGRAM = [sys.executable, "-m", "cli.commands.main"]


def ev(kind: int = 1, content: str = "", sk: bytes = SK, created_at: int | None = None):
    ts = int(time.time()) if created_at is None else created_at
    return sign_event(sk, ts, kind, [], content, AUX)


def http_get(
    port: int, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics: (name, labels) -> value."""
    status, headers, body = http_get(port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout} s")
        time.sleep(0.2)


# --- metrics ------------------------------------------------------------------------------


async def test_metrics_move_when_events_flow(start_relay):
    rp = start_relay()
    before = scrape(rp.port)
    assert sample(before, "engram_build_info", version=metrics_version(before)) == 1
    assert sample(before, "engram_events_total", tenant="default", result="stored", reason="") == 0

    live = await Client.connect(rp.url)
    events, end = await live.req("live", {"kinds": [1, 20001]})
    assert end[0] == "EOSE" and events == []
    async with await Client.connect(rp.url) as c:
        e1, e2 = ev(content="one"), ev(content="two")
        assert (await c.publish(e1))[2] is True
        assert (await c.publish(e2))[2] is True
        assert (await c.publish(e1))[3].startswith("duplicate:")
        tampered = msgspec.structs.replace(ev(content="three"), content="changed")
        ok = await c.publish(tampered)
        assert ok[2] is False and ok[3].startswith("invalid:")
        assert (await c.publish(ev(kind=20001, content="blip")))[2] is True
        assert len(await c.query({"kinds": [1]})) == 2
        for _ in range(3):  # the live subscription got both stored events and the ephemeral
            assert (await live.expect("EVENT"))[1] == "live"

        m = scrape(rp.port)
        tenant = {"tenant": "default"}
        assert sample(m, "engram_connections", **tenant) == 2
        assert sample(m, "engram_connections_accepted_total", **tenant) >= 2
        assert sample(m, "engram_subscriptions", **tenant) == 1  # "q" was closed
        events = "engram_events_total"
        assert sample(m, events, **tenant, result="stored", reason="") == 2
        assert sample(m, events, **tenant, result="duplicate", reason="duplicate") == 1
        assert sample(m, events, **tenant, result="rejected", reason="invalid") == 1
        assert sample(m, events, **tenant, result="ephemeral", reason="") == 1
        assert sample(m, "engram_messages_total", **tenant, type="EVENT") == 5
        assert sample(m, "engram_messages_total", **tenant, type="REQ") == 2
        assert sample(m, "engram_messages_total", **tenant, type="CLOSE") == 1
        assert sample(m, "engram_req_duration_seconds_count", **tenant) == 2
        assert sample(m, "engram_req_duration_seconds_bucket", **tenant, le="+Inf") == 2
        assert sample(m, "engram_live_events_total", **tenant) == 3
        assert sample(m, "engram_write_batch_size_sum") == 3  # two stored + the duplicate
        assert sample(m, "engram_write_batch_size_count") >= 1
        assert sample(m, "engram_write_commit_seconds_count") >= 1
        assert sample(m, "engram_db_pool_connections", state="max") == 10
        assert sample(m, "engram_db_pool_connections", state="idle") >= 1
        assert ("engram_slow_consumers_total", frozenset()) in m
        assert sample(m, "process_cpu_seconds_total") > 0
    await live.close()
    wait_for(
        lambda: sample(scrape(rp.port), "engram_connections", tenant="default") == 0,
        what="connections back to 0",
    )
    after = scrape(rp.port)
    assert sample(after, "engram_subscriptions", tenant="default") == 0


def metrics_version(samples: dict) -> str:
    for name, labels in samples:
        if name == "engram_build_info":
            return dict(labels)["version"]
    raise AssertionError("no engram_build_info")


def test_event_results_are_labelled_by_prefix():
    def count(**labels: str) -> float:
        return metrics.REGISTRY.get_sample_value("engram_events_total", labels) or 0.0

    t = "unit.test"
    metrics.event_result(t, 1, True, "")
    metrics.event_result(t, 1, True, "duplicate: already have this event")
    metrics.event_result(t, 1, False, "blocked: this event was deleted by its author")
    metrics.event_result(t, 1, False, "pow: difficulty 3 < 8")
    metrics.event_result(t, 1, False, "free text without a prefix")
    metrics.limited(t, wire.EventMsg(ev()))
    assert count(tenant=t, result="stored", reason="") == 1
    assert count(tenant=t, result="duplicate", reason="duplicate") == 1
    assert count(tenant=t, result="rejected", reason="blocked") == 1
    assert count(tenant=t, result="rejected", reason="pow") == 1
    assert count(tenant=t, result="rejected", reason="other") == 1
    assert count(tenant=t, result="rejected", reason="rate-limited") == 1


# --- health and readiness -----------------------------------------------------------------


class PgProxy:
    """TCP 127.0.0.1:port -> the PostgreSQL server of a test URL; `cut()` is an outage."""

    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        query = parse_qs(parts.query)
        if parts.hostname:
            self.target: tuple[int, object] = (
                socket.AF_INET,
                (parts.hostname, parts.port or 5432),
            )
        else:
            port = query.get("port", ["5432"])[0]
            self.target = (socket.AF_UNIX, f"{query['host'][0]}/.s.PGSQL.{port}")
        self.user = parts.username or "postgres"
        self.password = parts.password or ""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_cut = False
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database: str) -> str:
        auth = self.user + (f":{self.password}" if self.password else "")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}?sslmode=disable"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.is_cut:
                client.close()
                continue
            upstream = socket.socket(self.target[0], socket.SOCK_STREAM)
            try:
                upstream.connect(self.target[1])
            except OSError:
                client.close()
                upstream.close()
                continue
            with self.lock:
                self.open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
            with self.lock:
                self.open.discard(s)

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        self.is_cut = True
        with self.lock:
            sockets, self.open = list(self.open), set()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self.is_cut = False

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def pg_proxy(pg_server_url):
    proxy = PgProxy(pg_server_url)
    yield proxy
    proxy.close()


def test_health_and_readiness_follow_the_database(start_relay, pg_server_url, pg_proxy):
    database = urlsplit(create_database_sync(pg_server_url)).path.lstrip("/")
    rp = start_relay(database_url=pg_proxy.url(database))

    def ready() -> tuple[int, str]:
        status, _, body = http_get(rp.port, "/readyz")
        return status, body

    def healthy() -> bool:
        status, _, body = http_get(rp.port, "/healthz")
        return (status, body) == (200, "ok\n")

    assert ready() == (200, "ready\n")
    assert healthy()
    pg_proxy.cut()
    wait_for(lambda: ready()[0] == 503, what="/readyz 503 while the database is cut")
    assert ready() == (503, "not ready: database unreachable\n")
    assert healthy()  # the process is alive: no restart wanted
    assert http_get(rp.port, "/metrics")[0] == 200
    pg_proxy.restore()
    wait_for(lambda: ready() == (200, "ready\n"), what="/readyz 200 after the restore")
    assert healthy()


def test_health_endpoints_ignore_the_host(relay):
    for path in ("/healthz", "/readyz", "/metrics"):
        status, _, _ = http_get(relay.port, path, {"Host": "no-such-tenant.example"})
        assert status == 200, path


# --- HTML page ----------------------------------------------------------------------------


async def test_browser_gets_an_html_page(start_relay):
    rp = start_relay(
        env={
            "ENGRAM_RELAY_NAME": "<Tom & Jerry>",
            "ENGRAM_RELAY_DESCRIPTION": "memory for agents",
            "ENGRAM_TENANT_REFRESH_SECONDS": "0.5",
        }
    )
    async with await Client.connect(rp.url) as c:
        assert (await c.publish(ev(content="counted")))[2] is True
        status, headers, body = http_get(rp.port, "/", {"Accept": "text/html"})
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "&lt;Tom &amp; Jerry&gt;" in body and "<Tom" not in body
        assert "memory for agents" in body
        assert f"ws://127.0.0.1:{rp.port}" in body
        assert "<th>connections</th><td>1</td>" in body
        assert "<th>events stored</th><td>1</td>" in body
        assert "<th>max_limit</th><td>500</td>" in body
        assert ">42</a>" in body  # supported NIPs
    # what a request says about itself names no relay (relay.identity): the page shows
    # the URLs AUTH is accepted for, and that no public URL is configured
    _, _, proxied = http_get(rp.port, "/", {"X-Forwarded-Proto": "https", "Host": "relay.example"})
    assert "relay.example" not in proxied and f"ws://127.0.0.1:{rp.port}" in proxied
    assert "No public URL is configured" in proxied
    status, headers, doc = http_get(rp.port, "/", {"Accept": "application/nostr+json"})
    assert headers["content-type"].startswith("application/nostr+json")
    assert json.loads(doc)["name"] == "<Tom & Jerry>"

    # with tenants: the page is the tenant's, an unknown host is a 404 (the one event
    # stored before stays the built-in tenant's: --leave-default, as the refusal says)
    cli = [*ENGRAM, "tenant", "add", "a.test", "--database-url", rp.database_url]
    subprocess.run(
        [*cli, "--name", "Alpha", "--leave-default"], check=True, capture_output=True, timeout=60
    )
    wait_for(lambda: "Alpha" in http_get(rp.port, "/", {"Host": "a.test"})[2], what="reload")
    _, _, alpha = http_get(rp.port, "/", {"Host": "a.test"})
    assert "<h1>Alpha</h1>" in alpha and f"ws://a.test:{rp.port}" in alpha
    assert "<th>events stored</th><td>0</td>" in alpha
    assert http_get(rp.port, "/", {"Host": "other.test"})[0] == 404


# --- configuration ------------------------------------------------------------------------


def serve(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    return subprocess.run(
        [*ENGRAM, "serve", "--port", "1", "--database-url", "postgresql://nowhere/x", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**full_env, **(env or {})},
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[limits]\nmax_limit = "abc"\n', "limits.max_limit: expected an integer, got 'abc'"),
        ("foo = 1\n", "unknown setting 'foo' in"),
        ("[limits]\nmax_limt = 5\n", "unknown setting 'limits.max_limt' in"),
        ('port = "7777"\n', "port: expected an integer, got '7777'"),
        ("limits = 5\n", "limits: expected a table [limits], got 5"),
        ('log_format = "xml"\n', "log_format: expected one of text, json, got 'xml'"),
        ("write_batch_max = -3\n", "write_batch_max: must not be negative, got -3"),
        ("[limits]\nmax_limit = 10\ndefault_limit = 20\n", "limits.default_limit"),
        ("port = \n", "config file"),  # not TOML at all
        ('auth_challenge = "sometimes"\n', "auth_challenge: expected one of on-connect"),
        ('public_urls = ["relay.example.com"]\n', "public_urls: 'relay.example.com' is not"),
        ('public_urls = ["https://relay.example.com"]\n', "public_urls: 'https://relay"),
        ('metrics_allow = ["10.0.0.0/33"]\n', "metrics_allow: '10.0.0.0/33' is not"),
        (
            "negentropy_max_items = 1000\nnegentropy_budget_bytes = 40000\n",
            "negentropy_budget_bytes (40000) is below what one NEG-OPEN reserves",
        ),
    ],
)
def test_config_file_errors_name_the_setting(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_settings(str(path), env={})
    assert message in str(err.value)


def test_serve_with_bad_config_exits_naming_the_setting(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[limits]\nmax_limit = "abc"\n')
    proc = serve(tmp_path, "--config", str(bad))
    assert proc.returncode == 2
    assert "configuration error: limits.max_limit: expected an integer, got 'abc'" in proc.stderr
    proc = serve(tmp_path, env={"ENGRAM_CONFIG": str(bad)})
    assert proc.returncode == 2 and "limits.max_limit" in proc.stderr
    proc = serve(tmp_path, env={"ENGRAM_LIMITS_MAX_LIMIT": "lots"})
    assert proc.returncode == 2
    assert "ENGRAM_LIMITS_MAX_LIMIT: expected an integer, got 'lots'" in proc.stderr
    proc = serve(tmp_path, "--log-format", "xml")
    assert proc.returncode == 2 and "log_format: expected one of text, json" in proc.stderr


def test_negentropy_budget_fits_one_session_or_nip77_is_off():
    """(max_items + 1) x 40 bytes is one NEG-OPEN's reservation: a budget below it would
    refuse every NEG-OPEN; with no sessions allowed NIP-77 is off and nothing is checked."""
    fits = {"ENGRAM_NEGENTROPY_MAX_ITEMS": "1000", "ENGRAM_NEGENTROPY_BUDGET_BYTES": "40040"}
    assert load_settings(env=fits).negentropy_budget_bytes == 40040
    with pytest.raises(ConfigError, match="negentropy_max_sessions = 0"):
        load_settings(env={**fits, "ENGRAM_NEGENTROPY_BUDGET_BYTES": "40039"})
    off = {**fits, "ENGRAM_NEGENTROPY_BUDGET_BYTES": "0", "ENGRAM_NEGENTROPY_MAX_SESSIONS": "0"}
    assert load_settings(env=off).negentropy_max_sessions == 0


def test_serve_says_so_when_its_port_is_taken(tmp_path):
    """Bound before anything else: no `serving` line, no database started, exit 1 with a
    message naming the address and the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*ENGRAM, "serve", "--port", str(port), "--database-url", "postgresql://nowhere/x"],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")},
            cwd=tmp_path,
        )
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in proc.stderr
    assert f"port {port}" in proc.stderr.split("address already in use", 1)[1]
    assert "serving" not in proc.stdout + proc.stderr


def test_env_errors_name_the_variable():
    cases = {
        "ENGRAM_PORT": ("http", "ENGRAM_PORT: expected an integer"),
        "ENGRAM_TENANT_REFRESH_SECONDS": ("soon", "ENGRAM_TENANT_REFRESH_SECONDS: expected a num"),
        "ENGRAM_LIMITS_AUTH_REQUIRED": ("maybe", "ENGRAM_LIMITS_AUTH_REQUIRED: expected a bool"),
        "ENGRAM_LOG_LEVEL": ("loud", "log_level: expected one of debug, info"),
    }
    for var, (value, message) in cases.items():
        with pytest.raises(ConfigError) as err:
            load_settings(env={var: value})
        assert message in str(err.value), var


def test_every_setting_is_settable_from_toml_and_env_overrides_it(tmp_path):
    changed = msgspec.to_builtins(Settings())
    for table in (changed, *(v for v in changed.values() if isinstance(v, dict))):
        for name, value in table.items():
            if isinstance(value, bool):
                table[name] = not value
            elif isinstance(value, int | float):
                table[name] = value + 3
    changed["limits"]["default_limit"] = changed["limits"]["max_limit"]
    changed |= {"database_url": "postgresql://u:pw@h/d", "log_format": "json", "log_level": "debug"}
    path = tmp_path / "all.toml"
    path.write_text(to_toml(changed))
    settings = load_settings(str(path), env={})
    assert msgspec.to_builtins(settings) == changed
    env = {"ENGRAM_PORT": "9", "ENGRAM_LIMITS_MAX_LIMIT": "777", "ENGRAM_LOG_FORMAT": "text"}
    settings = load_settings(str(path), env=env)
    assert (settings.port, settings.limits.max_limit, settings.log_format) == (9, 777, "text")
    assert settings.limits.max_filters == changed["limits"]["max_filters"]  # from the file


def test_config_show_masks_secrets(tmp_path):
    path = tmp_path / "engram.toml"
    path.write_text(
        'database_url = "postgresql://engram:hunter2@db:5432/engram"\n'
        'relay_name = "Ops test"\n[limits]\nmax_limit = 42\n'
    )
    runner = CliRunner()
    env = {"ENGRAM_PORT": "9999", "ENGRAM_CONFIG": None, "ENGRAM_DATABASE_URL": None}
    result = runner.invoke(app, ["config", "show", "--config", str(path)], env=env)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "hunter2" not in out
    assert 'database_url = "postgresql://engram:***@db:5432/engram"' in out
    assert "port = 9999" in out and 'relay_name = "Ops test"' in out
    assert "[limits]\n" in out and "max_limit = 42" in out
    shown = tomllib.loads(out)  # the text is TOML
    assert shown["limits"]["max_limit"] == 42

    env["ENGRAM_CONFIG"] = str(path)
    result = runner.invoke(app, ["config", "show", "--json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["database_url"] == "postgresql://engram:***@db:5432/engram"
    assert data["limits"]["max_limit"] == 42 and data["port"] == 9999

    bad = tmp_path / "bad.toml"
    bad.write_text("nope = true\n")
    result = runner.invoke(app, ["config", "show", "--config", str(bad)], env=env)
    assert result.exit_code == 2
    assert "unknown setting 'nope'" in result.stderr


def test_masking_rules():
    data = {
        "database_url": "postgresql://u@h/d?password=pw&sslmode=require",
        "relay_pubkey": "ab" * 32,
        "tls_key": "/etc/engram/key.pem",
        "api_token": "t0k",
        "nested": {"admin_password": "p", "other": 1},
        "unset_secret": None,
    }
    out = masked(data)
    assert out["database_url"] == "postgresql://u@h/d?password=***&sslmode=require"
    assert out["relay_pubkey"] == "ab" * 32  # public
    assert out["tls_key"] == "/etc/engram/key.pem"  # a path, not the key
    assert out["api_token"] == "***" and out["nested"] == {"admin_password": "***", "other": 1}
    assert out["unset_secret"] is None


# --- keygen -------------------------------------------------------------------------------


def test_keygen_round_trips():
    runner = CliRunner()
    result = runner.invoke(app, ["keygen"])
    assert result.exit_code == 0, result.output
    fields = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert set(fields) == {"nsec", "npub", "secret_hex", "public_hex"}
    secret, public = bytes.fromhex(fields["secret_hex"]), fields["public_hex"]
    assert decode(fields["nsec"]) == ("nsec", secret)
    assert decode(fields["npub"]) == ("npub", bytes.fromhex(public))
    assert pubkey_of(secret) == public
    assert "private" in result.stderr  # the reminder goes to stderr, not into the output

    again = json.loads(runner.invoke(app, ["keygen", "--json"]).stdout)
    assert again["secret_hex"] != fields["secret_hex"]
    assert decode(again["nsec"])[1].hex() == again["secret_hex"]
    assert pubkey_of(bytes.fromhex(again["secret_hex"])) == again["public_hex"]


# --- logs ---------------------------------------------------------------------------------


async def test_json_logs_are_json_lines_without_content(start_relay):
    rp = start_relay(args=("--log-format", "json"))
    async with await Client.connect(rp.url) as c:
        assert (await c.publish(ev(content="do-not-log-this-content")))[2] is True
    rp.stop()  # shutdown lines too
    lines = [line for line in rp.log().splitlines() if line.strip()]
    assert lines
    records = [json.loads(line) for line in lines]
    for r in records:
        assert {"ts", "level", "logger", "msg"} <= r.keys()
    assert any(r["msg"].startswith("engram-relay serving ws://") for r in records)
    assert "do-not-log-this-content" not in rp.log()


def test_text_logs_by_default(relay):
    first = relay.log().splitlines()[0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(first)
    assert " INFO engram: engram-relay serving ws://" in relay.log()


def test_json_formatter_extras_and_exceptions():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("engram.test_ops")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("batch of %d failed", 3, extra={"tenant": "a.test"})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it broke")
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "batch of 3 failed" and first["tenant"] == "a.test"
    assert first["level"] == "warning" and first["logger"] == "engram.test_ops"
    assert first["ts"].endswith("Z")
    assert second["msg"] == "it broke" and "ValueError: boom" in second["exc"]
