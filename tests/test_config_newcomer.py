"""Configuration as a newcomer meets it (issue 46, the newcomer's list): `engram config
show` prints every setting plainly and its output is a config file `--config` reads back;
a misspelt `ENGRAM_*` variable is named at start-up instead of silently ignored.
Real `engram` processes; the relay on a real PostgreSQL database."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import msgspec

from relay.config import (
    OTHER_PREFIXES,
    OTHER_VARIABLES,
    load_settings,
    setting_variables,
    unknown_variables,
)

ROOT = Path(__file__).resolve().parent.parent
ENGRAM = [sys.executable, "-m", "cli.commands.main"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any ENGRAM_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    return {**env, **extra}


def engram(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ENGRAM, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


# --- engram config show -------------------------------------------------------------------


def test_config_show_prints_private_kinds_and_its_output_reads_back(tmp_path: Path) -> None:
    chosen = {
        "ENGRAM_LIMITS_PRIVATE_KINDS": "4,1059",
        "ENGRAM_PORT": "9999",
        "ENGRAM_RATE_EXEMPT_LOOPBACK": "false",
        "ENGRAM_RETENTION_OLDER_THAN": "90d",
        "ENGRAM_PUBLIC_URLS": "wss://relay.example.com",
        "ENGRAM_SEARCH_KINDS": "1,30023",
    }
    shown = engram("config", "show", env=clean_env(**chosen), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "private_kinds = [4, 1059]\n" in shown.stdout  # not masked: kinds are no secret
    assert "***" not in shown.stdout
    path = tmp_path / "shown.toml"
    path.write_text(shown.stdout)
    # the printed file is a config file: the same settings, read back with no environment
    expected = load_settings(env=chosen)
    assert msgspec.to_builtins(load_settings(str(path), env={})) == msgspec.to_builtins(expected)
    again = engram("config", "show", "--config", str(path), env=clean_env(), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == shown.stdout
    as_json = engram("config", "show", "--json", env=clean_env(**chosen), cwd=tmp_path)
    assert json.loads(as_json.stdout)["limits"]["private_kinds"] == [4, 1059]


def test_config_show_still_masks_a_password_and_says_so(tmp_path: Path) -> None:
    env = clean_env(ENGRAM_DATABASE_URL="postgresql://engram:hunter2@db:5432/engram")
    shown = engram("config", "show", env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "hunter2" not in shown.stdout
    line = next(x for x in shown.stdout.splitlines() if x.startswith("database_url"))
    assert line.startswith('database_url = "postgresql://engram:***@db:5432/engram"  # masked')
    path = tmp_path / "shown.toml"
    path.write_text(shown.stdout)
    assert load_settings(str(path), env={}).database_url == "postgresql://engram:***@db:5432/engram"


# --- misspelt ENGRAM_* variables ----------------------------------------------------------


def test_a_misspelt_variable_is_named_at_start_up_with_the_likely_one(start_relay) -> None:
    rp = start_relay(
        env={
            "ENGRAM_LIMITS_MAX_LIMT": "5",  # misspelt: max_limit stays 500
            "ENGRAM_PROT": "1",
            "ENGRAM_FROBNICATE": "yes",
            "ENGRAM_RELAY": "ws://127.0.0.1:1",  # the client's: not reported
            "ENGRAM_BENCH_HOME": "/tmp",  # the bench's: not reported
            "ENGRAM_LIMITS_MAX_FILTERS": "9",  # a setting, spelt right
        }
    )
    with urllib.request.urlopen(
        urllib.request.Request(rp.http_url, headers={"Accept": "application/nostr+json"}),
        timeout=30,
    ) as r:
        limitation = json.loads(r.read())["limitation"]
    assert (limitation["max_limit"], limitation["max_filters"]) == (500, 9)
    warned = [line for line in rp.log().splitlines() if "is not a setting" in line]
    assert len(warned) == 3, rp.log()
    text = "\n".join(warned)
    assert (
        "environment variable ENGRAM_LIMITS_MAX_LIMT is not a setting and is ignored;"
        " did you mean ENGRAM_LIMITS_MAX_LIMIT?" in text
    )
    assert "ENGRAM_PROT is not a setting and is ignored; did you mean ENGRAM_PORT?" in text
    assert "ENGRAM_FROBNICATE is not a setting and is ignored (engram config show" in text
    assert all("WARNING" in line for line in warned)


def test_no_warning_when_every_variable_is_known() -> None:
    env = {name: "x" for name in setting_variables() | OTHER_VARIABLES}
    env |= {prefix + "ANYTHING": "x" for prefix in OTHER_PREFIXES} | {"PATH": "/bin"}
    assert unknown_variables(env) == []
    assert len(unknown_variables({**env, "ENGRAM_LIMITS_MAX_LIMT": "5"})) == 1


def test_every_engram_variable_the_project_names_is_known() -> None:
    """Each `ENGRAM_*` name that the code, the tests or the deploy files use is a setting
    or listed in relay.config.OTHER_VARIABLES: `engram serve` never warns about one of
    the project's own variables."""
    variable = re.compile(r"ENGRAM_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")  # not a prefix
    names: set[str] = set()
    for package in ("relay", "cli", "bench", "tests"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == Path(__file__).name:
                continue  # misspelt on purpose above
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    names.update(variable.findall(node.value))
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file():
            names.update(variable.findall(path.read_text(encoding="utf-8", errors="replace")))
    assert len(names) > 40
    assert unknown_variables(dict.fromkeys(names, "")) == []
