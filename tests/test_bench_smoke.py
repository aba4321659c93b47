"""Smoke tests of the bench suite: it runs and reports figures. No timing is asserted.

Benchmarks are never pass/fail on speed (the machine is shared and noisy); these tests
only make the suite notice when `python -m bench` itself breaks.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay_fixtures import RelayProcess

from bench import compare, micro
from bench.peers import RELAYS
from bench.results import PhaseResult, phase_title, write_results
from bench.workload import Profile

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--events", "200", "--engrams", "100", "--reqs", "40", "--heads", "40",
    "--connections", "2", "--window", "10", "--req-connections", "2", "--req-window", "2",
    "--subscribers", "5", "--fanout-rate", "20", "--fanout-seconds", "1",
    "--phase-timeout", "60",
]  # fmt: skip


def test_bench_load_against_a_real_relay(relay: RelayProcess, tmp_path: Path) -> None:
    env = {**os.environ, "ENGRAM_BENCH_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "bench", "load", "--url", relay.url, "--pid", str(relay.pid)]
    proc = subprocess.run(
        [*cmd, *TINY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    ops = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^  (\S.*?)\s+(\d+) ok in ", proc.stdout, re.MULTILINE)
    }
    for phase in ("kind1", "engram", "req", "head", "fanout5"):
        assert ops.get(phase_title(phase), 0) > 0, out
    assert "relay CPU us/op" in proc.stdout, out  # the figures table was printed
    assert list((tmp_path / "cache").glob("kind1-200-*.msgpack")), "events were not cached"


def test_bench_entry_point_help(capsys) -> None:
    from bench.__main__ import main

    assert main([]) == 0
    assert "compare" in capsys.readouterr().out
    assert main(["nope"]) == 2


def test_micro_cases_run_once() -> None:
    for _name, fn in micro.cases() + micro.relay_cases():
        fn()


def test_compare_report_and_results_file(tmp_path: Path) -> None:
    """The report renders medians and ratios from results, and names a relay that failed."""

    def result(phase: str, ops: int, cpu: float) -> PhaseResult:
        return PhaseResult(
            phase, ops=ops, elapsed=1.0, latencies=[0.001, 0.002], relay_cpu=cpu,
            errors=Counter({"rate-limited: slow down": 1}),
        )  # fmt: skip

    profile = Profile(phases=("kind1",))
    ours = compare.RelayRuns("ours", RELAYS["ours"], "0.1")
    ours.rounds = [[result("kind1", 1000, 0.1)], [result("kind1", 3000, 0.2)]]
    peer = compare.RelayRuns("nostr-sdk", RELAYS["nostr-sdk"], "0.45")
    peer.rounds = [[result("kind1", 1000, 0.1)]]
    broken = compare.RelayRuns("nostr-relay-pg", RELAYS["nostr-relay-pg"])
    broken.problem = "not installed: pip failed"
    text = compare.report([ours, peer, broken], profile, rounds=2)
    assert "| engram-relay 0.1 | 2,000 |" in text  # median of 1,000 and 3,000 ops/s
    assert "| ours / nostr-sdk LocalRelay | 2.00 |" in text
    assert "not run: not installed: pip failed" in text
    path = tmp_path / "RESULTS.md"
    path.write_text(f"# notes\n\n{compare.BEGIN}\nold\n{compare.END}\n\nafter\n")
    write_results(path, text, compare.BEGIN, compare.END)
    written = path.read_text()
    assert "old" not in written and "after" in written and "# notes" in written
    assert "ours / nostr-sdk" in written


def test_engram_bench_mounts_the_suite() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "cli.commands.main", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "compare" in out.stdout and "soak" in out.stdout


def test_store_insert_bench_runs(pg_server_url: str) -> None:
    """Both insert variants of `bench.store_insert` still match the schema."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            *(sys.executable, "-m", "bench.store_insert", "--events", "40"),
            *("--baseline-events", "5", "--copy", "--database-url", pg_server_url),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "[copy], kind 1" in out.stdout and "'stored': 40" in out.stdout


def run_into_results(
    tmp_path: Path, begin: str, end: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """`python -m bench ARGS --results FILE` in a fresh corpus cache under tmp_path, FILE
    holding an old block between the command's markers: the run must succeed and replace
    that block only. Returns the process and the file's new text."""
    results = tmp_path / "RESULTS.md"
    results.write_text(f"# notes\n\n{begin}\nold\n{end}\n\nafter\n")
    env = {**os.environ, "ENGRAM_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--results", str(results)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = results.read_text()
    assert "old" not in text and "after" in text and "# notes" in text
    return proc, text


def test_bench_scale_end_to_end(tmp_path: Path) -> None:
    """`bench scale` at a tiny size: both corpora signed and cached, loaded through a real
    `engram serve`, every shape answered, the report written between its markers."""
    from bench.corpus import CORPORA, SHAPES
    from bench.scale import BEGIN, END

    proc, text = run_into_results(tmp_path, BEGIN, END, "scale", "--sizes", "300", "--reps", "3")
    out = proc.stdout + proc.stderr
    assert "load average before the run:" in proc.stdout, out
    assert "engram serve (pid" in proc.stdout, out
    assert "load average (1, 5, 15 min): before" in text
    for name in CORPORA:
        assert f"### corpus: {name}" in text, text
        assert list((tmp_path / "cache").glob(f"scale-{name}-s1-n300-*/upto-0000000300.msgpack"))
    section = {name: text.split(f"### corpus: {name}")[1] for name in CORPORA}
    for name, body in section.items():
        for shape in SHAPES:  # every shape answered: p50 / p99 figures, not "-"
            row = re.search(rf"^\| `{re.escape(shape)}` \|[^|]*\| ([\d.]+) / ([\d.]+) ", body, re.M)
            assert row, f"{name} {shape}:\n{body}"
        # every EVENT stored (no refusals), replaceable events replacing older versions
        rows = re.search(r"^\| 300 \| ([\d,]+) \|", body, re.M)
        assert rows and 250 <= int(rows.group(1).replace(",", "")) <= 300, body
        assert "EVENTs refused" not in body and "no answer" not in body, body
        # disk: data directory and WAL, and each index with its idx_scan
        assert re.search(r"^\| events \| events_pkey \| [\d.]+ \| [\d,]+ \| [\d,]+ \|", body, re.M)
        assert re.search(r"^\| event_tags \| event_tags_time \| ", body, re.M), body
        assert "CPU per EVENT" in body, body


def test_scale_report_compares_first_and_last_chunks() -> None:
    """Ingest drift: CPU per EVENT over the first `window` events against the last, whole
    chunks only; the latency target is issue 25's max(2 x smallest size's p99, 15 ms)."""
    from bench.scalereport import ChunkLoad, drift, target_met

    bounds = [0, 10_000, 100_000, *range(200_000, 1_000_001, 100_000)]
    chunks = [
        ChunkLoad(a, b, 1.0, (b - a) * (100e-6 if b <= 100_000 else 120e-6))
        for a, b in itertools.pairwise(bounds)
    ]
    first, last, n_first, n_last = drift(chunks, 100_000)
    assert (n_first, n_last) == (100_000, 100_000)
    assert round(first or 0) == 100 and round(last or 0) == 120
    assert target_met(2.0, 15.0) == "met" and target_met(10.0, 20.0) == "met"
    assert target_met(10.0, 20.5) == "**missed**" and target_met(None, 1.0) == "-"


def test_bench_flood_end_to_end(tmp_path: Path) -> None:
    """`bench flood` at a tiny size: the corpus signed and cached, loaded through a real
    `engram serve`, the victim's figures in both phases, every flooded REQ of every shape
    with an outcome (EOSE, CLOSED, a hang or a lost connection, all counted), and the
    report written between its markers. Nothing about speed is asserted."""
    from bench.flood import BEGIN, END

    _, text = run_into_results(
        tmp_path,
        BEGIN,
        END,
        *("flood", "--size", "300", "--seconds", "1.5", "--flooders", "2", "--in-flight", "3"),
    )
    assert list((tmp_path / "cache").glob("scale-skewed-s1-n300-*/upto-0000000300.msgpack"))
    assert "load average (1, 5, 15 min): before" in text
    assert "engram_reads_closed_total" in text and "**Verdict (issue 25" in text
    for phase in ("baseline (no flood)", "under flood"):  # p50 / p99 / max of the victim
        row = re.search(
            rf"^\| {re.escape(phase)} \| \d+ \| ([\d,]+) \| [\d,.]+ \| [\d,.]+ \|", text, re.M
        )
        assert row and int(row.group(1).replace(",", "")) > 0, text
    ended = re.search(r"^Flooded REQs: ([\d,]+) sent, ([\d,]+) ended", text, re.M)
    assert ended and ended.group(1) == ended.group(2) and ended.group(1) != "0", text
    rows = re.findall(
        r"^\| ([^|]+) \| [^|]* \| ([\d,]+) \| ([\d,]+) \| ([\d,]+)"
        r" \| \**([\d,]+)\** \| ([\d,]+) \|",
        text,
        re.M,
    )
    num = lambda s: int(s.replace(",", ""))  # noqa: E731
    assert len(rows) >= 8, text  # the shapes and the total
    for name, sent, *outcomes in rows:  # each shape: sent = EOSE + CLOSED + hang + lost
        assert num(sent) == sum(map(num, outcomes)), (name, text)
    assert rows[-1][0] == "**all**" and num(rows[-1][1]) == num(ended.group(1)), text


def test_compare_settle_waits_no_longer_than_its_limit() -> None:
    """The wait for a quiet machine before each run is bounded (`--settle`)."""
    said: list[str] = []
    assert compare.settle(0.0, said.append, quiet=0.0) < 1  # never quiet: the limit ends it
    assert compare.settle(60.0, said.append, quiet=1e9) < 1  # always quiet: no wait
    assert said == []


def test_bench_abuse_end_to_end(tmp_path: Path) -> None:
    """`bench abuse` at a tiny size: a real relay with loopback limited, every phase with
    figures for the victim, the abusers' answers counted, the verdicts and the report
    between its markers. Nothing about speed is asserted."""
    from bench.abuse import BEGIN, END, PHASES

    _, text = run_into_results(
        tmp_path,
        BEGIN,
        END,
        *("abuse", "--rounds", "1", "--seconds", "0.5", "--samples", "2"),
        *("--flood-connections", "2", "--query-bytes", "5000", "--in-flight", "1"),
    )
    for phase in PHASES:
        row = re.search(rf"^\| 1 \| {phase} \| [^|]+ \| ([\d,]+) \|", text, re.M)
        assert row and int(row.group(1).replace(",", "")) > 0, text
    assert "| search flood | `longest allowed search: EOSE` |" in text, text
    assert "too many values in one REQ" in text and "**Verdicts (issue 37" in text


def test_bench_tagvalues_end_to_end() -> None:
    """`bench tagvalues` at a tiny size: a real relay answers REQs of 16, 256 and 1,024 tag
    values (the last at max_req_values, so not refused) and the table has a row for each.
    Nothing about speed is asserted."""
    tiny = ["--events", "300", "--tags", "50", "--reps", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "tagvalues", *tiny],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^\| ([\d,]+) \| (\d+) \| (\d+) \|", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["16", "256", "1,024"], proc.stdout
    assert all(int(events) > 0 for _, _, events in rows), proc.stdout


@pytest.fixture
def bench_home() -> Iterator[Path]:
    """ENGRAM_BENCH_HOME for kept stores, outside pytest's tmp_path: the embedded server
    runs as another user, who cannot enter pytest's 0700 base directory."""
    home = Path(tempfile.mkdtemp(prefix="engram-bench-test-home-"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _bench(
    tmp_path: Path, home: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m bench ARGS` with its event cache under tmp_path, kept stores in home."""
    env = {
        **os.environ,
        "ENGRAM_BENCH_CACHE": str(tmp_path / "cache"),
        "ENGRAM_BENCH_HOME": str(home),
    }
    env.pop("ENGRAM_BENCH_RELAY_ROOT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_compare_sustained_profile_on_a_prefilled_store(tmp_path: Path, bench_home: Path) -> None:
    """`bench compare --profile sustained --prefill N` at a tiny size: realistic notes
    ingested on a copy of a kept store of N corpus events, figures per chunk of answers
    (relay and PostgreSQL CPU apart), everything in the --json file. Nothing timed."""
    import json

    out = tmp_path / "run.json"
    proc = _bench(
        tmp_path,
        bench_home,
        *("compare", "--relays", "ours", "--profile", "sustained", "--rounds", "1"),
        *("--settle", "0", "--events", "300", "--chunk-events", "100"),
        *("--events-per-conn", "120", "--connections", "2", "--window", "10"),
        *("--prefill", "200", "--phase-timeout", "60", "--json", str(out)),
    )
    data = json.loads(out.read_text())
    assert data["profile"]["name"] == "sustained"
    assert data["profile"]["content"] == "realistic"
    ours = data["relays"]["ours"]
    (kind1,) = ours["rounds"][0]
    assert kind1["phase"] == "kind1" and kind1["ops"] == 300 and not kind1["errors"], kind1
    assert [(c["start"], c["end"]) for c in kind1["chunks"]] == [(0, 100), (100, 200), (200, 300)]
    for chunk in kind1["chunks"]:
        figures = chunk["figures"]
        assert figures["ops/s"] and figures["p99 ms"] is not None, chunk
        assert figures["relay CPU us/op"] is not None and figures["pg CPU us/op"] is not None
    assert [c["chunk"] for c in ours["chunk_medians"]["kind1"]] == ["0-100", "100-200", "200-300"]
    # the run started from the prefilled copy: its rows, then the 300 notes ingested
    prefilled = data["prefill"]
    assert prefilled["size"] == 200 and 0 < prefilled["rows"] <= 200, prefilled
    assert ours["stored"] == [prefilled["rows"] + 300], ours["stored"]
    assert (Path(prefilled["directory"]) / "filled.json").exists()
    assert "By chunk of answers" in proc.stdout and "- prefill: ours starts from" in proc.stdout
    assert list((tmp_path / "cache").glob("kind1_realistic-300-s1-a1000-*.msgpack"))


def test_compare_reads_profile(tmp_path: Path, bench_home: Path) -> None:
    """`bench compare --profile reads` at a tiny size: the notes stored, then the
    authors REQs 8 x 8 and the probe 8 x 1, every REQ answered. Nothing timed."""
    import json

    out = tmp_path / "run.json"
    proc = _bench(
        tmp_path,
        bench_home,
        *("compare", "--relays", "ours", "--profile", "reads", "--rounds", "1", "--settle", "0"),
        *("--events", "300", "--reqs", "60", "--probe-reqs", "20", "--json", str(out)),
        *("--phase-timeout", "60"),
    )
    (round_,) = json.loads(out.read_text())["relays"]["ours"]["rounds"]
    phases = {p["phase"]: p for p in round_}
    assert [p["phase"] for p in round_] == ["kind1", "req", "probe"]
    assert (phases["kind1"]["ops"], phases["req"]["ops"], phases["probe"]["ops"]) == (300, 60, 20)
    assert not any(p["errors"] for p in round_), round_
    assert phases["req"]["returned"] > 0 and phases["probe"]["returned"] > 0, round_
    assert "probe: 20 of the same REQ, 8 connections x 1 in flight" in proc.stdout
    assert "### REQ authors probe, 1 in flight" in proc.stdout


def test_ab_alternates_two_checkouts(tmp_path: Path, bench_home: Path) -> None:
    """`bench ab` with two tiny rounds: HEAD in a temporary git worktree against this
    checkout, each round running both with their own relay, the rounds, medians and a
    verdict per figure reported; the worktree is removed at the end. Nothing timed."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = _bench(
        tmp_path,
        bench_home,
        *("ab", "--before", "HEAD", "--after", str(ROOT), "--rounds", "2", "--"),
        *("compare", "--relays", "ours", "--rounds", "1", "--settle", "0", "--profile", "reads"),
        *("--events", "200", "--reqs", "40", "--probe-reqs", "10", "--prefill", "150"),
        *("--phase-timeout", "60"),
        timeout=600,
    )
    out = proc.stdout
    worktree = re.search(r"^before: HEAD = \w+ \(worktree\) at (\S+)$", out, re.M)
    assert worktree, out
    for k, first, second in ((1, "before", "after"), (2, "after", "before")):
        runs = re.findall(rf"^\[round {k} (\w+)\] ENGRAM_BENCH_RELAY_ROOT=(\S+) ", out, re.M)
        assert runs == [
            (first, worktree.group(1) if first == "before" else str(ROOT)),
            (second, worktree.group(1) if second == "before" else str(ROOT)),
        ], out
    assert out.count("prefill: reusing") == 3, out  # filled once, then copied
    section = out.split("### ingest kind-1")[1]
    row = re.search(r"^\| ops/s \| ([\d,]+) / ([\d,]+) \| ([\d,]+) / ([\d,]+) \|", section, re.M)
    assert row, out
    assert "too few rounds for 95% (at least 4 a side)" in section
    for phase in ("REQ authors limit 10", "REQ authors probe, 1 in flight"):
        assert f"### {phase}" in out
    assert not Path(worktree.group(1)).exists()
    assert (
        worktree.group(1)
        not in subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True
        ).stdout
    )


def test_ab_interval_needs_rounds_and_sees_a_shift() -> None:
    """The shift's interval (exact Mann-Whitney): none below 4 rounds a side at 95 %;
    a clear shift is outside it, the same values shuffled are inside."""
    import math

    from bench.ab import rounds_needed, shift, u_counts, verdict

    assert all(sum(u_counts(n, m)) == math.comb(n + m, n) for n in range(6) for m in range(6))
    assert rounds_needed(0.95) == 4
    few = shift([1.0, 2.0, 3.0], [10.0, 11.0, 12.0])
    assert few.low is None and "too few rounds" in verdict(few, "ops/s", 0.95)
    before = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
    moved = shift(before, [x + 10 for x in before])
    assert moved.estimate == 10 and (moved.low, moved.high) == (7, 13)
    assert moved.confidence >= 0.95
    assert verdict(moved, "ops/s", 0.95) == "outside: a finding (after better)"
    assert verdict(moved, "p99 ms", 0.95) == "outside: a finding (after worse)"
    same = shift(before, [13.0, 10.0, 17.0, 12.0, 15.0, 11.0, 16.0, 14.0])
    assert same.estimate == 0 and verdict(same, "ops/s", 0.95) == "inside the interval: noise"


def test_prefill_store_is_kept_per_schema(tmp_path: Path) -> None:
    """A checkout with another migration gets a store of its own (the kept directory's
    name carries a hash of the migrations)."""
    from bench.prefillstore import schema_key

    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_init.sql").write_text("CREATE TABLE a (x int);")
    first = schema_key(tmp_path)
    assert schema_key(tmp_path) == first
    (tmp_path / "migrations" / "0002_more.sql").write_text("CREATE TABLE b (x int);")
    assert schema_key(tmp_path) != first
    assert schema_key(ROOT) != first


def test_bench_crowd_end_to_end(tmp_path: Path) -> None:
    """`bench crowd` at a tiny size: two client processes connect a crowd, every fan-out
    reaches every connection, the reconnect storm reconnects all of them, and the report
    (phases, RSS figures, verdicts) is written between its markers. Nothing about speed
    is asserted."""
    from bench.crowd import BEGIN, END

    _, text = run_into_results(
        tmp_path,
        BEGIN,
        END,
        *("crowd", "--connections", "30", "--workers", "2", "--fanouts", "2"),
        *("--oks", "5", "--ok-rate", "200"),
    )
    lines = text.split("```")[1].strip().splitlines()  # the figures table
    cols = re.split(r"\s{2,}", lines[0])
    rows = [dict(zip(cols, re.split(r"\s{2,}", line), strict=True)) for line in lines[1:]]
    ops = {r["phase"]: (int(r["ops"]), int(r["errors"])) for r in rows}
    for phase in ("connect storm", "fan-out 1", "fan-out 2", "reconnect storm", "fan-out after"):
        assert ops.get(phase, (0, 1)) == (30, 0), text  # every connection, no error
    assert ops["EVENT->OK quiet"][0] == 5 and ops["EVENT->OK crowd"][0] == 5, text
    assert "RSS per connection:" in text and "target: fan-out p99" in text, text
