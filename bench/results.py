"""What a bench phase measured, and how every bench command prints and files it.

`PhaseResult` is one phase's figures (throughput, latency quantiles, errors by reason,
CPU and RSS of the processes watched, and per-chunk figures of a long ingest: `Chunk`);
`phase_json` is its machine-readable form (`--json`, read by `bench ab`); `fmt`,
`format_line` and `format_results` are the plain-text forms `bench load` prints;
`write_results` replaces a command's block in a markdown file such as bench/RESULTS.md;
`machine` and `run_lines` head a report (command, date, machine, load average);
`quantile` is how every command takes p50/p99.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASE_TITLES = {
    "kind1": "ingest kind-1",
    "engram": "ingest engram",
    "req": "REQ authors limit 10",
    "head": "REQ engram head (auth)",
    "probe": "REQ authors probe, 1 in flight",
}
FIGURES = (
    "ops/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "errors",
    "relay CPU us/op",
    "pg CPU us/op",
    "relay+pg CPU us/op",
    "relay RSS MB",
    "gen CPU us/op",
    "relay cores",
    "pg cores",
    "gen cores",
)
HIGHER_IS_BETTER = frozenset({"ops/s"})

_NUMBERS = re.compile(r"[0-9a-f]{16,}|\d+")


def reason_key(message: str) -> str:
    """Group error messages by their text with numbers and hex ids blanked out."""
    message = _NUMBERS.sub("#", message.strip())
    return message[:80] if message else "(no message)"


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` (nearest rank below; None when empty): the one rule
    every bench command reports p50/p99 by."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else None


def phase_title(name: str) -> str:
    if name.startswith("fanout"):
        return f"fan-out {name[6:]} subs"
    return PHASE_TITLES.get(name, name)


CHUNK_FIGURES = (
    "ops/s",
    "p50 ms",
    "p99 ms",
    "relay CPU us/op",
    "pg CPU us/op",
    "relay+pg CPU us/op",
)


@dataclass
class Chunk:
    """One stretch of a long phase: the operations answered from `start` to `end` (in
    answer order), their wall seconds, the CPU the relay's and PostgreSQL's process trees
    used meanwhile, and the latencies of the answers in it (seconds)."""

    start: int
    end: int
    seconds: float
    relay_cpu: float | None
    pg_cpu: float | None
    latencies: list[float] = field(default_factory=list, repr=False)

    def figures(self) -> dict[str, float | None]:
        n = self.end - self.start

        def per_op(cpu: float | None) -> float | None:
            return cpu / n * 1e6 if cpu is not None and n else None

        both = None if self.relay_cpu is None else self.relay_cpu + (self.pg_cpu or 0.0)
        p50, p99 = quantile(self.latencies, 0.50), quantile(self.latencies, 0.99)
        return {
            "ops/s": n / self.seconds if self.seconds > 0 else None,
            "p50 ms": p50 * 1e3 if p50 is not None else None,
            "p99 ms": p99 * 1e3 if p99 is not None else None,
            "relay CPU us/op": per_op(self.relay_cpu),
            "pg CPU us/op": per_op(self.pg_cpu),
            "relay+pg CPU us/op": per_op(both),
        }

    def label(self) -> str:
        return f"{count_label(self.start)}-{count_label(self.end)}"


def count_label(n: int) -> str:
    """100000 -> 100k, 1000000 -> 1M; other counts as they are."""
    if n and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


@dataclass
class PhaseResult:
    """What one phase measured. `ops`: OKs accepted, EOSEs, or deliveries."""

    phase: str
    ops: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    notes: collections.Counter[str] = field(default_factory=collections.Counter)
    relay_cpu: float | None = None
    pg_cpu: float | None = None
    gen_cpu: float = 0.0
    rss: int | None = None
    returned: int = 0  # events received in answer to REQs
    skipped: str = ""
    chunks: list[Chunk] = field(default_factory=list)  # a long phase, stretch by stretch

    def figures(self) -> dict[str, float | None]:
        lat = sorted(self.latencies)

        def q(p: float) -> float | None:
            v = quantile(lat, p)
            return v * 1e3 if v is not None else None

        def per_op(cpu: float | None) -> float | None:
            return cpu / self.ops * 1e6 if cpu is not None and self.ops else None

        def busy(cpu: float | None) -> float | None:
            return cpu / self.elapsed if cpu is not None and self.elapsed > 0 else None

        return {
            "ops/s": self.ops / self.elapsed if self.elapsed > 0 else None,
            "p50 ms": q(0.50),
            "p99 ms": q(0.99),
            "max ms": lat[-1] * 1e3 if lat else None,
            "errors": float(sum(self.errors.values())),
            "relay CPU us/op": per_op(self.relay_cpu),
            "pg CPU us/op": per_op(self.pg_cpu),
            "relay+pg CPU us/op": per_op(
                None if self.relay_cpu is None else self.relay_cpu + (self.pg_cpu or 0.0)
            ),
            "relay RSS MB": self.rss / 2**20 if self.rss is not None else None,
            "gen CPU us/op": per_op(self.gen_cpu),
            # cores busy over the phase (CPU seconds / wall seconds): a relay that waits
            # shows as less than the cores it could use
            "relay cores": busy(self.relay_cpu),
            "pg cores": busy(self.pg_cpu),
            "gen cores": busy(self.gen_cpu),
        }


# --- plain text -----------------------------------------------------------------------


def fmt(value: float | None, figure: str = "") -> str:
    if value is None:
        return "-"
    if figure == "errors":
        return f"{value:.0f}"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_line(r: PhaseResult) -> str:
    f = r.figures()
    return (
        f"  {phase_title(r.phase):<26} {r.ops:>8} ok in {r.elapsed:6.2f} s: "
        f"{fmt(f['ops/s'])}/s, p50 {fmt(f['p50 ms'])} ms, p99 {fmt(f['p99 ms'])} ms, "
        f"max {fmt(f['max ms'])} ms, errors {fmt(f['errors'], 'errors')}"
    )


def _aligned(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def format_results(results: list[PhaseResult]) -> str:
    """A plain-text table of every figure, then errors and notes by reason."""
    cols = ["phase", "ops", *FIGURES]
    rows = [
        [phase_title(r.phase), str(r.ops), *(fmt(v, k) for k, v in r.figures().items())]
        for r in results
    ]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = [_aligned(cols, widths)]
    lines += [_aligned(row, widths) for row in rows]
    for r in results:
        if r.chunks:
            lines.append(f"{phase_title(r.phase)}, by chunk of answers:")
            lines += format_chunks(r.chunks)
    for r in results:
        if r.returned:
            lines.append(f"{phase_title(r.phase)}: {r.returned} events returned")
        for label, counter in (("error", r.errors), ("note", r.notes)):
            for why, n in counter.most_common():
                lines.append(f"{phase_title(r.phase)}: {label} x{n}: {why}")
    return "\n".join(lines)


def format_chunks(chunks: list[Chunk]) -> list[str]:
    """A plain-text table of the chunks' figures."""
    cols = ["chunk", *CHUNK_FIGURES]
    rows = [[c.label(), *(fmt(v, k) for k, v in c.figures().items())] for c in chunks]
    widths = [max(len(col), *(len(row[i]) for row in rows)) for i, col in enumerate(cols)]
    return ["  " + _aligned(cols, widths), *("  " + _aligned(row, widths) for row in rows)]


def phase_json(r: PhaseResult) -> dict[str, Any]:
    """A phase's figures, errors and chunks as plain JSON values (`--json` files)."""
    return {
        "phase": r.phase,
        "ops": r.ops,
        "elapsed": r.elapsed,
        "returned": r.returned,
        "figures": r.figures(),
        "errors": dict(r.errors),
        "notes": dict(r.notes),
        "chunks": [{"start": c.start, "end": c.end, "figures": c.figures()} for c in r.chunks],
    }


# --- reports in markdown files ----------------------------------------------------------


def write_results(path: Path, text: str, begin: str, end: str) -> None:
    """Replace the generated block (between `begin` and `end`) of `path`, or append one."""
    old = path.read_text() if path.exists() else ""
    block = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = (old.rstrip() + "\n\n" if old else "") + block + "\n"
    path.write_text(new)


def machine() -> str:
    """The platform, CPUs and memory of this machine, for a report's header."""
    cpu = "?"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    mem = "?"
    with contextlib.suppress(OSError, StopIteration, ValueError):
        kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem = f"{kb / 2**20:.0f} GiB"
    return f"{platform.platform()}; {os.cpu_count()} CPUs ({cpu}); {mem} RAM"


def run_lines(command: str, argv: list[str], server: str, loadavg: tuple[Any, Any]) -> list[str]:
    """The first lines of a bench report: command, date, machine and store, and the load
    average before and after (a run that starts on a busy machine is not a result)."""
    before, after = loadavg
    return [
        f"- command: `python -m bench {command}{' ' + ' '.join(argv) if argv else ''}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; {server}",
        "- load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in after),
    ]
