"""`python -m bench ab --before REV_OR_PATH --after REV_OR_PATH --rounds N -- COMMAND ARGS`:
one bench run, alternately on two checkouts' relays, over enough rounds to decide.

Each side is a directory holding a checkout (`.` is this working tree, uncommitted
changes included) or a git revision of this repository, checked out with `git worktree
add --detach` in a temporary directory and removed at the end. The harness is this
checkout's bench/ for both sides; only the relay differs: every run gets
ENGRAM_BENCH_RELAY_ROOT=<side>, so `engram serve` runs that checkout's code (this venv's
python, PYTHONPATH set to the checkout), and a `--prefill` store is kept per schema (per
side when their migrations differ).

Round k runs both sides, the order alternating (before first in odd rounds), so a drift
of the machine falls on both. Each run is `python -m bench COMMAND ARGS --json FILE`:
COMMAND must write `--json` (`compare` does: give it `--relays ours --rounds 1` to time
ours only, once a run). Reported for `--relay` (ours), phase by phase: each side's value
in every round, the medians, after/before, the shift after - before (Hodges-Lehmann: the
median of all after - before differences) with its confidence interval from the exact
Mann-Whitney distribution (no assumption about the shape of the noise; 95 % needs 4
rounds a side, and more make it narrower), and a verdict: 0 inside the interval: noise;
outside: a finding (after better or worse).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.results import HIGHER_IS_BETTER, fmt, machine, phase_title, write_results

BEGIN, END = "<!-- ab:begin -->", "<!-- ab:end -->"
HARNESS = Path(__file__).resolve().parents[1]
FIGURES = (
    "ops/s",
    "p50 ms",
    "p99 ms",
    "relay CPU us/op",
    "pg CPU us/op",
    "relay+pg CPU us/op",
    "relay RSS MB",
)
LAST_CHUNK = "last chunk: relay+pg CPU us/op"  # a long ingest's cost at its end


class AbError(RuntimeError):
    """A side cannot be checked out, or the command is not one ab can run."""


# --- the statistics ----------------------------------------------------------------------


@functools.cache
def u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) orderings of two samples (sizes n and m, no ties) give
    each value 0..n*m of the Mann-Whitney U (pairs where the first sample's value is the
    larger): the exact distribution when both come from one distribution."""
    if n == 0 or m == 0:
        return (1,)
    out = [0] * (n * m + 1)
    for u, c in enumerate(u_counts(n - 1, m)):  # the largest value is the first sample's
        out[u + m] += c
    for u, c in enumerate(u_counts(n, m - 1)):  # ... or the second's
        out[u] += c
    return tuple(out)


@dataclass
class Shift:
    """after - before: the Hodges-Lehmann estimate and its interval (None: too few runs
    for the confidence asked), with the confidence the interval actually has."""

    estimate: float
    low: float | None
    high: float | None
    confidence: float


def shift(before: list[float], after: list[float], confidence: float = 0.95) -> Shift:
    """The shift of `after` from `before` with its distribution-free interval: the
    order statistics w and nm+1-w of the n*m differences, w the largest with
    2 P(U <= w-1) <= 1 - confidence (Hollander & Wolfe, the Mann-Whitney interval)."""
    n, m = len(before), len(after)
    if not n or not m:
        raise ValueError("both sides need at least one value")
    diffs = sorted(a - b for a in after for b in before)
    estimate = statistics.median(diffs)
    counts, total = u_counts(n, m), math.comb(n + m, n)
    alpha = 1.0 - confidence
    w, below = 0, 0
    while w < len(counts) and 2 * (below + counts[w]) / total <= alpha:
        below += counts[w]
        w += 1
    if w == 0:
        return Shift(estimate, None, None, 0.0)
    return Shift(estimate, diffs[w - 1], diffs[n * m - w], 1.0 - 2 * below / total)


def rounds_needed(confidence: float) -> int:
    """Rounds a side from which an interval at `confidence` exists."""
    k = 1
    while 2 / math.comb(2 * k, k) > 1.0 - confidence:
        k += 1
    return k


def verdict(s: Shift, figure: str, confidence: float) -> str:
    if s.low is None or s.high is None:
        return f"too few rounds for {confidence:.0%} (at least {rounds_needed(confidence)} a side)"
    if s.low <= 0 <= s.high:
        return "inside the interval: noise"
    higher = figure in HIGHER_IS_BETTER
    better = (s.low > 0) == higher
    return f"outside: a finding (after {'better' if better else 'worse'})"


# --- the two checkouts --------------------------------------------------------------------


@dataclass
class Side:
    """One checkout: where it is, what it is, and each round's figures from it."""

    name: str  # "before" or "after"
    spec: str  # as given
    root: Path
    what: str  # the revision, and whether the tree has changes
    worktree: bool = False
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)  # round -> relay's JSON
    failed: dict[int, str] = field(default_factory=dict)  # round -> why

    def values(self, phase: str, figure: str) -> list[float | None]:
        return [_figure(self.runs.get(k), phase, figure) for k in sorted(self.all_rounds())]

    def all_rounds(self) -> set[int]:
        return set(self.runs) | set(self.failed)


def _figure(run: dict[str, Any] | None, phase: str, figure: str) -> float | None:
    if run is None:
        return None
    if figure == LAST_CHUNK:
        chunks = (run.get("chunk_medians") or {}).get(phase) or []
        return chunks[-1]["figures"].get("relay+pg CPU us/op") if chunks else None
    value = ((run.get("medians") or {}).get(phase) or {}).get(figure)
    return float(value) if value is not None else None


def _git(*args: str, cwd: Path = HARNESS) -> str:
    out = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        raise AbError(f"git {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


def checkout(name: str, spec: str, tmp: Path) -> Side:
    """A directory as it is, or a revision in a fresh detached worktree under `tmp`."""
    path = Path(spec).expanduser()
    if path.is_dir():
        root = path.resolve()
        if not (root / "relay").is_dir() or not (root / "migrations").is_dir():
            raise AbError(f"{spec}: not a checkout of engram-relay (no relay/ or migrations/)")
        what = "a directory"
        with contextlib.suppress(AbError, OSError, subprocess.SubprocessError):
            head = _git("rev-parse", "--short", "HEAD", cwd=root)
            changed = _git("status", "--porcelain", "--untracked-files=no", cwd=root)
            what = f"{head}{' + uncommitted changes' if changed else ''}"
        return Side(name, spec, root, what)
    sha = _git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    root = tmp / f"{name}-{sha[:10]}"
    _git("worktree", "add", "--detach", str(root), sha)
    return Side(name, spec, root, f"{sha[:10]} (worktree)", worktree=True)


def remove(side: Side) -> None:
    if side.worktree:
        with contextlib.suppress(AbError, OSError, subprocess.SubprocessError):
            _git("worktree", "remove", "--force", str(side.root))


# --- running ------------------------------------------------------------------------------


def run_side(side: Side, k: int, command: list[str], relay: str, tmp: Path, say: Any) -> None:
    """One run of the command on this side's relay; files its figures or why it failed."""
    out = tmp / f"{side.name}-{k}.json"
    cmd = [sys.executable, "-m", "bench", *command, "--json", str(out)]
    env = {**os.environ, "ENGRAM_BENCH_RELAY_ROOT": str(side.root)}
    tag = f"[round {k} {side.name}]"
    say(f"{tag} ENGRAM_BENCH_RELAY_ROOT={side.root} python -m bench {shlex.join(command)}")
    with subprocess.Popen(
        cmd,
        cwd=HARNESS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        tail: list[str] = []
        report = False  # the run's own report (its figures are in the JSON) is not echoed
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail = [*tail[-19:], line]
            report = report or line.startswith("- command:")
            if line and (not report or line.startswith(("(", "relay logs"))):
                say(f"{tag} {line}")
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError):
        side.failed[k] = f"exit {proc.returncode}, no --json: {' / '.join(tail[-3:])}"[:400]
        return
    found = (data.get("relays") or {}).get(relay)
    if not found or not found.get("rounds"):
        why = (found or {}).get("problem") or "; ".join((found or {}).get("failures") or [])
        side.failed[k] = f"{relay} did not run: {why or 'not in the run'}"[:400]
        return
    side.runs[k] = found


def phases_of(sides: list[Side]) -> list[str]:
    out: list[str] = []
    for side in sides:
        for run in side.runs.values():
            for phase in run.get("medians") or {}:
                if phase not in out:
                    out.append(phase)
    return out


# --- the report ---------------------------------------------------------------------------


def _row(values: list[float | None], figure: str) -> str:
    return " / ".join(fmt(v, figure) for v in values)


def report(
    argv: list[str],
    before: Side,
    after: Side,
    rounds: int,
    relay: str,
    confidence: float,
) -> str:
    lines = [
        f"- command: `python -m bench ab {shlex.join(argv)}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; load average now {os.getloadavg()[0]:.2f}",
        f"- before: `{before.spec}` = {before.what}; after: `{after.spec}` = {after.what}",
        f"- {rounds} rounds, each running both sides, before first in odd rounds; figures"
        f" of `{relay}` (each run's median); shift = after - before (Hodges-Lehmann) with its"
        f" {confidence:.0%} interval (exact Mann-Whitney; the interval's own confidence in"
        " brackets); 0 inside the interval: noise, outside: a finding",
    ]
    for side in (before, after):
        for k, why in sorted(side.failed.items()):
            lines.append(f"- round {k}, {side.name}: failed: {why}")
    header = [
        "figure",
        "before (each round)",
        "after (each round)",
        "median before",
        "median after",
        "after/before",
        "shift [interval] (confidence)",
        "verdict",
    ]
    for phase in phases_of([before, after]):
        rows = []
        for figure in (*FIGURES, LAST_CHUNK):
            b_all, a_all = before.values(phase, figure), after.values(phase, figure)
            b = [v for v in b_all if v is not None]
            a = [v for v in a_all if v is not None]
            if not b and not a:
                continue
            mb = statistics.median(b) if b else None
            ma = statistics.median(a) if a else None
            ratio = f"{ma / mb:.3f}" if mb and ma is not None else "-"
            if b and a:
                s = shift(b, a, confidence)
                interval = (
                    f"[{fmt(s.low, figure)}, {fmt(s.high, figure)}] ({s.confidence:.1%})"
                    if s.low is not None and s.high is not None
                    else "[-]"
                )
                est = s.estimate if abs(s.estimate) > 1e-9 else 0.0  # CPU sums' float dust
                change = f"{'+' if est >= 0 else '-'}{fmt(abs(est), figure)}"
                cells = [f"{change} {interval}", verdict(s, figure, confidence)]
            else:
                cells = ["-", "one side has no figure"]
            medians = [fmt(mb, figure), fmt(ma, figure), ratio]
            rows.append([figure, _row(b_all, figure), _row(a_all, figure), *medians, *cells])
        lines += ["", f"### {phase_title(phase)}", ""]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --- command line -------------------------------------------------------------------------


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit(
            "usage: python -m bench ab --before REV_OR_PATH --after REV_OR_PATH [--rounds N]"
            " -- COMMAND ARGS (e.g. -- compare --relays ours --rounds 1 --profile sustained)"
        )
    cut = argv.index("--")
    p = argparse.ArgumentParser(
        prog="python -m bench ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--before", required=True, help="a git revision or a checkout's directory")
    p.add_argument("--after", required=True, help="a git revision or a checkout's directory")
    p.add_argument("--rounds", type=int, default=8, help="rounds (each runs both sides)")
    p.add_argument("--relay", default="ours", help="whose figures to compare (a key of --relays)")
    p.add_argument("--confidence", type=float, default=0.95, help="of the interval")
    p.add_argument("--results", type=Path, help="write the report into this markdown file")
    p.add_argument("--keep", action="store_true", help="keep the worktrees and the runs' JSON")
    args = p.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command or command[0] in ("ab", "-h", "--help"):
        p.error("after --, a bench command that writes --json (compare)")
    if args.rounds < 1 or not 0 < args.confidence < 1:
        p.error("--rounds must be at least 1 and --confidence between 0 and 1")
    return args, command


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        parse(["--help", "--"])
    args, command = parse(argv)
    say = lambda s: print(s, flush=True)  # noqa: E731
    tmp = Path(tempfile.mkdtemp(prefix="engram-bench-ab-"))
    sides: list[Side] = []
    try:
        try:
            sides.append(checkout("before", args.before, tmp))
            sides.append(checkout("after", args.after, tmp))
        except AbError as exc:
            print(f"ab: {exc}", file=sys.stderr)
            return 2
        before, after = sides
        for side in sides:
            say(f"{side.name}: {side.spec} = {side.what} at {side.root}")
        for k in range(1, args.rounds + 1):
            for side in (before, after) if k % 2 else (after, before):
                run_side(side, k, command, args.relay, tmp, say)
        text = report(argv, before, after, args.rounds, args.relay, args.confidence)
        print()
        print(text)
        if args.results:
            write_results(args.results, text, BEGIN, END)
            say(f"wrote {args.results}")
        return 0 if before.runs and after.runs else 1
    finally:
        if args.keep:
            say(f"kept {tmp}")
        else:
            for side in sides:
                remove(side)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
