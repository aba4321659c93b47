"""`python -m bench compare`: this relay against its peers, same events, same profile, one run.

Starts each relay on loopback in turn (ours on an embedded PostgreSQL with its default,
durable settings; the peers of `bench.peers`, each from its own virtualenv), drives it
with `bench.load` (events from the shared cache: byte-identical for every relay), stops
it, and goes on; every start is a fresh store. Rounds alternate the relays' order, and
each figure is the median over the rounds, because this machine is shared and noisy:
only ratios taken in one run mean much. Before each relay's run it waits (`--settle`, up
to 300 s) for the 1-minute load average to fall below 0.5, and reports the value it
starts at: a run that starts on a busy machine is not a result. Prints a table per phase,
then ours/peer for every figure (ops/s: above 1 is ours faster; every other figure: below
1 is ours better).

`--profile` picks the load (bench/workload.py): `standard` (a burst of every phase),
`sustained` (issue 47: 200,000 realistic kind-1 EVENTs, figures per 100k answers) or
`reads` (issue 48: 40,000 notes stored, REQs 8 x 8 and a probe 8 x 1); the last two run
ours and nostr-sdk's LocalRelay unless `--relays` says otherwise. `--prefill N` starts ours
on a copy of a kept store of N events (bench/prefillstore.py; the peers start empty).

`--results bench/RESULTS.md` rewrites the generated part of that file (between its
`<!-- compare:begin -->` and `<!-- compare:end -->` markers) with this run; `--json FILE`
writes every figure of every round (what `bench ab` reads).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path

from bench import charts, prefillstore
from bench.events import Keyring, load_events
from bench.lanes import CLIENTS, raise_fd_limit, run_async
from bench.peers import RELAYS, PeerError, Postgres, RelaySpec, stored_events
from bench.results import (
    CHUNK_FIGURES,
    FIGURES,
    HIGHER_IS_BETTER,
    PhaseResult,
    fmt,
    machine,
    phase_json,
    phase_title,
    write_results,
)
from bench.workload import (
    Profile,
    add_profile_args,
    fanout_count,
    kind1_events,
    profile_from_args,
    run_load,
)

BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
DEFAULT_RELAYS = ("ours", "nostr-relay-sqlite", "nostr-relay-pg", "nostr-sdk")
# the long profiles: ours and LocalRelay (nostr-relay's 600 EVENTs/s would take minutes)
PROFILE_RELAYS = {"sustained": ("ours", "nostr-sdk"), "reads": ("ours", "nostr-sdk")}


@dataclass
class Prefill:
    """The kept store ours starts from (`--prefill`): its size, corpus and seed."""

    size: int = 0
    corpus: str = "realistic"
    seed: int = 1


# The figures shown round by round under each phase's medians: one bad round is a finding.
ROUND_FIGURES = ("ops/s", "p99 ms", "relay+pg CPU us/op", "relay cores", "pg cores")


@dataclass
class RelayRuns:
    """Everything measured for one relay over the rounds."""

    key: str
    spec: RelaySpec
    version: str = ""
    problem: str = ""  # why it did not run (install or start failure)
    rounds: list[list[PhaseResult]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)  # 1-minute load average before each run
    stored: list[int] = field(default_factory=list)  # ours: events stored after each run

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.version}".strip()

    def median(self, phase: str, figure: str) -> float | None:
        values = []
        for results in self.rounds:
            for r in results:
                if r.phase == phase:
                    v = r.figures()[figure]
                    if v is not None:
                        values.append(v)
        return statistics.median(values) if values else None

    def per_round(self, phase: str, figure: str) -> str:
        """The figure in each round, in order ('-' where the round has none)."""
        out = []
        for results in self.rounds:
            v = next((r.figures()[figure] for r in results if r.phase == phase), None)
            out.append(fmt(v, figure))
        return " / ".join(out)

    def chunk_medians(self, phase: str) -> list[tuple[str, dict[str, float | None]]]:
        """Each chunk of the phase (by position) with the median of each figure over the
        rounds that reached it."""
        per_round = [r.chunks for results in self.rounds for r in results if r.phase == phase]
        out = []
        for i in range(max((len(c) for c in per_round), default=0)):
            reached = [chunks[i] for chunks in per_round if len(chunks) > i]
            figures = [c.figures() for c in reached]
            medians = {}
            for f in CHUNK_FIGURES:
                values = [x[f] for x in figures if x[f] is not None]
                medians[f] = statistics.median(values) if values else None
            out.append((reached[0].label(), medians))
        return out

    def to_json(self, phases: list[str]) -> dict[str, object]:
        return {
            "label": self.label,
            "problem": self.problem,
            "failures": self.failures,
            "loads": self.loads,
            "stored": self.stored,
            "rounds": [[phase_json(r) for r in results] for results in self.rounds],
            "medians": {p: {f: self.median(p, f) for f in FIGURES} for p in phases},
            "chunk_medians": {
                p: [{"chunk": label, "figures": m} for label, m in self.chunk_medians(p)]
                for p in phases
            },
        }

    def reasons(self, phase: str) -> tuple[Counter[str], Counter[str]]:
        errors: Counter[str] = Counter()
        notes: Counter[str] = Counter()
        for results in self.rounds:
            for r in results:
                if r.phase == phase:
                    errors.update(r.errors)
                    notes.update(r.notes)
        return errors, notes


def run_compare(
    keys: list[str],
    profile: Profile,
    rounds: int,
    say: Callable[[str], None] = print,
    keep_logs: bool = False,
    settle_seconds: float = 0.0,
    filled: Prefill | None = None,
) -> tuple[list[RelayRuns], str, prefillstore.Filled | None]:
    """Prepare, then run every relay once per round; returns the runs, the PG settings
    and, with `filled.size`, the kept store ours started from."""
    runs = [RelayRuns(k, RELAYS[k]) for k in keys]
    for run in runs:
        try:
            run.version = run.spec.prepare(say)
        except PeerError as exc:
            run.problem = f"not installed: {exc}"
            say(f"{run.spec.name}: {run.problem}")
    _events_ready(profile)
    root = Path(tempfile.mkdtemp(prefix="engram-bench-compare-"))
    pg: Postgres | None = None
    pg_settings = ""
    store: prefillstore.Filled | None = None
    if any(r.spec.needs_postgres and not r.problem for r in runs):
        try:
            if filled is not None and filled.size and "ours" in keys:
                pg, store = prefillstore.open_store(filled.corpus, filled.seed, filled.size, say)
            else:
                pg = Postgres(root)
            pg_settings = pg.settings()
        except Exception as exc:
            for r in runs:
                if r.spec.needs_postgres:
                    r.problem = f"embedded PostgreSQL failed: {exc}"
    try:
        for n in range(rounds):
            order = runs if n % 2 == 0 else list(reversed(runs))
            for run in order:
                if run.problem:
                    continue
                say(f"round {n + 1}/{rounds}: {run.spec.name}")
                _one(run, root / f"{run.key}-{n}", pg, profile, say, settle_seconds)
    finally:
        if pg is not None:
            pg.close()
        had_errors = any(
            r.failures or any(p.errors for results in r.rounds for p in results) for r in runs
        )
        if keep_logs or had_errors:
            say(f"relay logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return runs, pg_settings, store


def _events_ready(profile: Profile) -> None:
    """Sign (or read from the cache) what the phases send, once, before any relay runs."""
    warm = Keyring(profile.seed)
    phases = profile.phases
    if "kind1" in phases:
        kind1_events(profile, warm)
    if "engram" in phases:
        load_events("engram", profile.engrams, warm)
    if "fanout" in phases:
        for s in profile.subscribers:
            load_events("fanout", fanout_count(profile), warm, variant=str(s))
    if "head" in phases:
        _ = warm.d_tags


# A run that starts on a busy machine is not a result (bench/RESULTS.md): before each
# relay's run, wait for the 1-minute load average to fall below this, at most `settle` s.
QUIET_LOAD = 0.5


def settle(limit: float, say: Callable[[str], None], quiet: float = QUIET_LOAD) -> float:
    """Wait until the 1-minute load average is below `quiet`, at most `limit` seconds;
    returns the seconds waited (the previous relay's run, or anything else, lingers in the
    average for a minute or two)."""
    t0 = time.monotonic()
    while os.getloadavg()[0] >= quiet and time.monotonic() - t0 < limit:
        time.sleep(5)
    waited = time.monotonic() - t0
    if waited >= 1:
        say(f"  waited {waited:.0f} s for the load average to settle")
    return waited


def _one(
    run: RelayRuns,
    workdir: Path,
    pg: Postgres | None,
    profile: Profile,
    say: Callable[[str], None],
    settle_seconds: float = 0.0,
) -> None:
    if settle_seconds > 0:
        settle(settle_seconds, say)
    run.loads.append(os.getloadavg()[0])
    say(f"  load average before the run: {run.loads[-1]:.2f}")
    try:
        relay = run.spec.start(workdir, pg)
    except PeerError as exc:
        run.failures.append(f"start failed: {exc}")
        say(f"  {run.failures[-1]}")
        return
    try:
        # a peer that needs fresh connections (LocalRelay) gets them, within the profile's
        per_conn = [n for n in (profile.events_per_conn, relay.events_per_conn) if n]
        p = Profile(**{**profile.__dict__, "events_per_conn": min(per_conn, default=0)})
        results = run_async(run_load(relay.url, p, relay.pid, relay.pg_pid, say))
        run.rounds.append(results)
        if relay.dsn:
            run.stored.append(stored_events(relay.dsn))
        if relay.proc.poll() is not None:
            run.failures.append(f"exited during the run: {relay.log_tail(5)}")
    except Exception as exc:
        run.failures.append(f"load failed: {type(exc).__name__}: {exc}")
        say(f"  {run.failures[-1]}\n{relay.log_tail()}")
    finally:
        relay.stop()


# --- report -------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def ratio(ours: float | None, peer: float | None) -> str:
    if ours is None or peer is None:
        return "-"
    if peer == 0:
        return "-" if ours == 0 else "inf"
    r = ours / peer
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"  # 0.0048 must not read as 0.00


def _why_not(r: RelayRuns) -> str:
    text = r.problem or (r.failures[0] if r.failures else "no round completed")
    return " ".join(text.split())[:300].replace("|", "/")


def report(runs: list[RelayRuns], profile: Profile, rounds: int) -> str:
    """Markdown: one table of medians per phase, one of ratios ours/peer per phase."""
    better = ", ".join(sorted(HIGHER_IS_BETTER))
    lines: list[str] = [
        f"Ratios are ours / peer: for {better} above 1 is ours better; for every other"
        " figure below 1 is ours better.",
        "",
    ]
    ok = [r for r in runs if r.rounds]
    lines.append("Relays:")
    lines.append("")
    for r in runs:
        status = r.problem or f"{len(r.rounds)} of {rounds} rounds ran"
        extra = "".join(f"; {' '.join(f.split())[:300]}" for f in r.failures)
        loads = " / ".join(f"{x:.2f}" for x in r.loads)
        load_note = f"; load average before each round: {loads}" if loads else ""
        stored = " / ".join(f"{x:,}" for x in r.stored)
        stored_note = f"; events stored at the end of each round: {stored}" if stored else ""
        lines.append(f"- {r.label}, store: {r.spec.store}: {status}{load_note}{stored_note}{extra}")
    ours = next((r for r in ok if r.key == "ours"), None)
    peers = [r for r in ok if r.key != "ours"]
    for phase in profile.phase_names():
        lines += ["", f"### {phase_title(phase)}", ""]
        rows = [[r.label, *(fmt(r.median(phase, f), f) for f in FIGURES)] for r in runs if r.rounds]
        rows += [
            [r.label, f"not run: {_why_not(r)}", *([""] * (len(FIGURES) - 1))]
            for r in runs
            if not r.rounds
        ]
        lines += _table(["relay (median)", *FIGURES], rows)
        if ours is not None and peers:
            lines.append("")
            rows = [
                [
                    f"ours / {p.spec.name}",
                    *(ratio(ours.median(phase, f), p.median(phase, f)) for f in FIGURES),
                ]
                for p in peers
            ]
            lines += _table(["ratio", *FIGURES], rows)
        lines.append("")
        rows = [[r.label, *(r.per_round(phase, f) for f in ROUND_FIGURES)] for r in ok]
        lines += _table(["relay (each round)", *ROUND_FIGURES], rows)
        lines += _chunk_table(ok, phase)
        reasons = []
        for r in ok:
            errors, notes = r.reasons(phase)
            for why, n in errors.most_common(4):
                reasons.append(f"- {r.spec.name}: error x{n} (all rounds): {why}")
            for why, n in notes.most_common(3):
                reasons.append(f"- {r.spec.name}: note x{n} (all rounds): {why}")
        if reasons:
            lines += ["", *reasons]
    return "\n".join(lines)


def _chunk_table(ok: list[RelayRuns], phase: str) -> list[str]:
    """Each relay's figures per chunk of answers (medians over the rounds), if measured."""
    rows = [
        [r.label, label, *(fmt(m[f], f) for f in CHUNK_FIGURES)]
        for r in ok
        for label, m in r.chunk_medians(phase)
    ]
    if not rows:
        return []
    return [
        "",
        "By chunk of answers, in answer order (medians over the rounds):",
        "",
        *_table(["relay", "answers", *CHUNK_FIGURES], rows),
    ]


def header(
    argv: list[str],
    profile: Profile,
    rounds: int,
    pg_settings: str,
    store: prefillstore.Filled | None = None,
) -> str:
    libs = ", ".join(f"{n} {version(n)}" for n in ("msgspec", "uvicorn", "websockets", "asyncpg"))
    cmd = "python -m bench compare" + ("" if not argv else " " + shlex.join(argv))
    lines = [
        f"- command: `{cmd}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}",
        f"- python: {platform.python_version()} ({platform.python_implementation()}); {libs}",
        f"- postgres: {pg_settings or 'not used'}",
        f"- profile {profile.describe()}; {rounds} rounds, medians; load generator:"
        f" {profile.client} client ({_writes(profile)}); CPU counts the relay's process tree"
        " and its PostgreSQL's; `cores` is CPU seconds over the phase's wall seconds",
    ]
    root = os.environ.get("ENGRAM_BENCH_RELAY_ROOT")
    if root:
        lines.append(f"- ours: the relay of {root} (ENGRAM_BENCH_RELAY_ROOT)")
    if store is not None:
        lines.append(f"- prefill: {store.describe()}")
    return "\n".join(lines)


def _writes(profile: Profile) -> str:
    if CLIENTS[profile.client].coalesce:
        return "frames queued together joined into one write: not how users' clients send"
    return "one write per message"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--relays",
        help=f"comma-separated subset of {','.join(RELAYS)} (default: all of them; with"
        " --profile sustained or reads: ours,nostr-sdk)",
    )
    p.add_argument("--rounds", type=int, default=2, help="rounds (medians are reported)")
    p.add_argument("--results", type=Path, help="write the tables into this markdown file")
    p.add_argument("--keep-logs", action="store_true", help="keep the relays' logs and files")
    p.add_argument(
        "--settle",
        type=float,
        default=300.0,
        help="before each relay's run, wait up to this many seconds for the 1-minute load"
        f" average to fall below {QUIET_LOAD} (0: do not wait); the value is reported",
    )
    p.add_argument("--json", type=Path, help="write every figure of every round into this file")
    add_profile_args(p)
    prefillstore.add_prefill_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    profile = profile_from_args(args)
    default = PROFILE_RELAYS.get(profile.name, DEFAULT_RELAYS)
    keys = [k for k in (args.relays or ",".join(default)).split(",") if k]
    unknown = [k for k in keys if k not in RELAYS]
    if unknown:
        print(f"unknown relay(s): {', '.join(unknown)}; known: {', '.join(RELAYS)}")
        return 2
    if args.prefill < 0:
        print("--prefill: a number of events, 0 or more")
        return 2
    raise_fd_limit()  # inherited by the relays: 1,000 subscribers need descriptors
    t0 = time.monotonic()
    runs, pg_settings, store = run_compare(
        keys,
        profile,
        max(1, args.rounds),
        keep_logs=args.keep_logs,
        settle_seconds=args.settle,
        filled=Prefill(args.prefill, args.prefill_corpus, args.prefill_seed),
    )
    text = (
        header(argv, profile, args.rounds, pg_settings, store)
        + "\n\n"
        + report(runs, profile, args.rounds)
    )
    if args.json:
        write_json(args.json, argv, profile, runs, store)
    print()
    print(text)
    print(f"\n(compare took {time.monotonic() - t0:.0f} s)")
    if args.results:
        made = write_charts(runs, profile, args.results.parent)
        if made:
            text += "\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in made)
            print("charts: " + ", ".join(map(str, made)))
        else:
            print(charts.SKIPPED)
        write_results(args.results, text, BEGIN, END)
        print(f"wrote {args.results}")
    return 0 if any(r.rounds for r in runs) else 1


def write_json(
    path: Path,
    argv: list[str],
    profile: Profile,
    runs: list[RelayRuns],
    store: prefillstore.Filled | None,
) -> None:
    """Every figure of every round, each relay's medians and chunk medians, as JSON."""
    phases = profile.phase_names()
    data = {
        "command": ["compare", *argv],
        "relay_root": os.environ.get("ENGRAM_BENCH_RELAY_ROOT") or "",
        "profile": asdict(profile),
        "prefill": asdict(store) if store is not None else None,
        "relays": {r.key: r.to_json(phases) for r in runs},
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def write_charts(runs: list[RelayRuns], profile: Profile, directory: Path) -> list[Path]:
    """Throughput, p99 and CPU per operation of every phase, one bar per relay (medians)."""
    ok = [r for r in runs if r.rounds]
    phases = profile.phase_names()
    titles = [phase_title(p).replace(" ", "\n", 1) for p in phases]
    made = []
    for name, figure, label, log in (
        ("compare-throughput.png", "ops/s", "operations/s (higher is better)", True),
        ("compare-p99.png", "p99 ms", "p99 latency, ms (lower is better)", True),
        ("compare-cpu.png", "relay+pg CPU us/op", "relay+PG CPU us/op (lower is better)", True),
    ):
        series = {r.label: [r.median(p, figure) for p in phases] for r in ok}
        path = charts.bars(directory / name, f"bench compare: {label}", titles, series, figure, log)
        if path is not None:
            made.append(path)
    return made
