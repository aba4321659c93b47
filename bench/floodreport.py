"""What one `bench flood` run measured, and its markdown report with the verdict
(issue 25, done when 3: the victim's p99 under flood <= 50 ms, and every flooded REQ
ended with EOSE or CLOSED)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.floodclients import (
    DROPPED,
    FLOODER_ADDRESS,
    HANG,
    VICTIM_ADDRESS,
    FloodStats,
    Phase,
    ShapeStats,
)
from bench.floodshapes import FloodShape
from bench.results import run_lines

TARGET_P99_MS = 50.0  # issue 25, done when 3


@dataclass
class FloodRun:
    corpus: str
    size: int
    rows: int = 0
    server: str = ""
    load_seconds: float = 0.0
    refused: Counter[str] = field(default_factory=Counter)
    baseline: Phase = field(default_factory=lambda: Phase("baseline (no flood)"))
    flood: Phase = field(default_factory=lambda: Phase("under flood"))
    stats: FloodStats = field(default_factory=FloodStats)
    shapes: list[FloodShape] = field(default_factory=list)
    drain_seconds: float = 0.0
    closed_before: dict[str, float] = field(default_factory=dict)
    closed_after: dict[str, float] = field(default_factory=dict)


@dataclass
class Options:
    seconds: float
    baseline_seconds: float
    flooders: int
    in_flight: int
    deadline: float
    seed: int
    only: tuple[str, ...] = ()  # flood shapes to send (names); empty: all


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def _cores(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def victim_line(p: Phase) -> str:
    odd = {k: n for k, n in p.outcomes.items() if k != "EOSE"}
    return (
        f"victim {p.name}: {len(p.latencies):,} REQs, p50 {_ms(p.pct(0.5))} ms,"
        f" p99 {_ms(p.pct(0.99))} ms, max {_ms(p.pct(1.0))} ms" + (f" {odd}" if odd else "")
    )


def clean(total: ShapeStats) -> bool:
    """Every flooded REQ ended with EOSE or CLOSED."""
    return all(k == "EOSE" or k.startswith("CLOSED ") for k in total.outcomes)


def verdict(run: FloodRun) -> str:
    p99 = run.flood.pct(0.99)
    total = run.stats.total()
    hangs = total.outcomes.get(HANG, 0)
    dropped = sum(n for k, n in total.outcomes.items() if k.startswith(DROPPED))
    victim_odd = sum(n for k, n in run.flood.outcomes.items() if k != "EOSE")
    ok = p99 is not None and p99 <= TARGET_P99_MS and clean(total) and not victim_odd
    why = [
        f"victim p99 under flood {_ms(p99)} ms (target <= {TARGET_P99_MS:g} ms)",
        f"{hangs:,} flooded REQs hung",
        f"{dropped:,} lost with their connection",
    ]
    if victim_odd:
        why.append(f"{victim_odd:,} victim REQs not answered with EOSE")
    return f"**Verdict (issue 25, done when 3): {'met' if ok else 'MISSED'}**: " + "; ".join(why)


def report(run: FloodRun, argv: list[str], o: Options, loadavg: tuple[Any, Any]) -> str:
    lines = [
        *run_lines("flood", argv, run.server, loadavg),
        f"- store: {run.corpus} corpus, {run.size:,} signed EVENTs sent through `engram serve`'s"
        f" websocket in {run.load_seconds:,.0f} s ({run.rows:,} rows after VACUUM ANALYZE)"
        + (f"; refused: {dict(run.refused.most_common(3))}" if run.refused else ""),
        f'- victim: one connection from {VICTIM_ADDRESS}, `{{"authors":[a],"limit":10}}`'
        " one at a time (a drawn by author popularity), each CLOSEd after its EOSE;"
        f" flood: {o.flooders} connections from {FLOODER_ADDRESS} (loopback: no rate limit)"
        f" x {o.in_flight} REQs in flight, rotating through the shapes below; a REQ"
        f" unanswered {o.deadline:g} s is a hang",
        "",
        *_victim_table(run),
        "",
        *_flooded_lines(run),
        "",
        f"`engram_reads_closed_total` (/metrics) before / after the flood: {_closed_total(run)}",
    ]
    extra = []
    if run.stats.late:
        extra.append(f"{run.stats.late:,} answers came after their REQ was counted as a hang")
    if run.stats.reconnects:
        extra.append(f"flooders reconnected {run.stats.reconnects:,} times")
    if run.stats.notices:
        extra.append("NOTICEs: " + ", ".join(f"{k} x{n}" for k, n in run.stats.notices.items()))
    if extra:
        lines += ["", "; ".join(extra)]
    lines += ["", verdict(run)]
    return "\n".join(lines)


def _victim_table(run: FloodRun) -> list[str]:
    lines = [
        "| victim `authors` | s | REQs | p50 ms | p99 ms | max ms | not EOSE |"
        " relay cores | PG cores | bench cores |",
        "|---|--:|--:|--:|--:|--:|---|--:|--:|--:|",
    ]
    for p in (run.baseline, run.flood):
        odd = ", ".join(f"{k} x{n}" for k, n in p.outcomes.items() if k != "EOSE") or "0"
        lines.append(
            f"| {p.name} | {p.seconds:.0f} | {len(p.latencies):,} | {_ms(p.pct(0.5))} |"
            f" {_ms(p.pct(0.99))} | {_ms(p.pct(1.0))} | {odd} | {_cores(p.relay_cores)} |"
            f" {_cores(p.pg_cores)} | {_cores(p.bench_cores)} |"
        )
    return lines


def _flooded_lines(run: FloodRun) -> list[str]:
    """The flooded REQs: how many ended and how, per shape, CLOSED reasons, losses."""
    total = run.stats.total()
    answered = sum(total.outcomes.values())
    rate = run.stats.answered_in_window / run.flood.seconds if run.flood.seconds else 0.0
    lines = [
        f"Flooded REQs: {total.sent:,} sent, {answered:,} ended"
        f" ({run.stats.answered_in_window:,} within the {run.flood.seconds:.0f} s:"
        f" {rate:,.1f}/s; the rest in {run.drain_seconds:.1f} s after it),"
        f" {run.stats.returned:,} events returned",
        "",
        "Latency of a flooded REQ includes its wait for the relay's read slots (a queue"
        " of the flood's own REQs); `--only SHAPE` floods with one shape to see its cost.",
        "",
        "| flood shape | filter | sent | EOSE | CLOSED | hang | conn. lost | p50 ms | max ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for shape in run.shapes:
        lines.append(_shape_row(shape.name, shape.what, run.stats.shapes[shape.name]))
    lines.append(_shape_row("**all**", "", total))
    closed = Counter({k: n for k, n in total.outcomes.items() if k.startswith("CLOSED ")})
    if closed:
        lines += ["", "| CLOSED reason (flooded REQs) | REQs |", "|---|--:|"]
        lines += [f"| `{k[7:]}` | {n:,} |" for k, n in closed.most_common()]
    dropped = {k: n for k, n in total.outcomes.items() if k.startswith(DROPPED)}
    if dropped:
        lines += [
            "",
            "Lost with their connection: " + ", ".join(f"{k} x{n}" for k, n in dropped.items()),
        ]
    return lines


def _closed_total(run: FloodRun) -> str:
    reasons = sorted(set(run.closed_before) | set(run.closed_after))
    return (
        ", ".join(
            f"{r} {run.closed_before.get(r, 0):,.0f} / {run.closed_after.get(r, 0):,.0f}"
            for r in reasons
        )
        or "0 / 0 (no sample)"
    )


def _shape_row(name: str, what: str, s: ShapeStats) -> str:
    closed = sum(n for k, n in s.outcomes.items() if k.startswith("CLOSED "))
    hang = s.outcomes.get(HANG, 0)
    lost = sum(n for k, n in s.outcomes.items() if k.startswith(DROPPED))
    p50 = statistics.median(s.latencies) if s.latencies else None
    top = max(s.latencies) if s.latencies else None
    hang_cell = f"**{hang:,}**" if hang else "0"
    return (
        f"| {name} | {what} | {s.sent:,} | {s.outcomes.get('EOSE', 0):,} | {closed:,} |"
        f" {hang_cell} | {lost:,} | {_ms(p50)} | {_ms(top)} |"
    )
