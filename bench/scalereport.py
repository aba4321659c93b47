"""The results of `bench scale` and their report: markdown tables and charts.

Kept apart from bench/scale.py (which loads and times) so each stays readable; the
figures are explained in bench/scale.py's docstring and bench/RESULTS.md ("scale").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench import charts
from bench.corpus import SHAPES
from bench.results import run_lines

WARMUP = 10  # unrecorded runs of each shape (prepared statements, caches)
TARGET_FLOOR_MS = 15.0  # issue 25: p99 at 1M <= max(2 x p99 at 10k, 15 ms)
DRIFT_TARGET = 1.25  # issue 25: CPU per EVENT, last 100k / first 100k

# --- results ------------------------------------------------------------------------


@dataclass
class ChunkLoad:
    start: int
    end: int
    wall: float
    cpu: float | None  # relay (or this process) + PostgreSQL, seconds
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        return self.end - self.start


@dataclass
class Disk:
    datadir: int = 0
    wal: int = 0
    database: int = 0
    # (table, relation, bytes): each table's total, heap, TOAST and maps, and each index
    relations: list[tuple[str, str, int]] = field(default_factory=list)

    def table(self, name: str) -> int:
        """pg_total_relation_size: heap, TOAST, maps and indexes."""
        return sum(b for t, r, b in self.relations if t == name and r == "(total)")


@dataclass
class Shape:
    p50: float | None = None
    p99: float | None = None
    cpu_us: float | None = None
    outcomes: Counter[str] = field(default_factory=Counter)
    returned: int = 0
    matches: tuple[int, int] | None = None  # fewest and most events carrying a value


@dataclass
class Step:
    size: int
    rows: int = 0
    chunks: list[ChunkLoad] = field(default_factory=list)
    shapes: dict[str, Shape] = field(default_factory=dict)
    disk: Disk = field(default_factory=Disk)
    vacuum_seconds: float = 0.0

    @property
    def load_wall(self) -> float:
        return sum(c.wall for c in self.chunks)

    def cpu_per_event(self) -> float | None:
        return _per_event(self.chunks)


@dataclass
class CorpusRun:
    corpus: str
    steps: list[Step] = field(default_factory=list)
    indexes: list[tuple[str, str, int, int]] = field(default_factory=list)  # +idx_scan
    server: str = ""
    kept: str = ""

    @property
    def chunks(self) -> list[ChunkLoad]:
        return [c for s in self.steps for c in s.chunks]


def _per_event(chunks: list[ChunkLoad]) -> float | None:
    n = sum(c.events for c in chunks)
    if not n or any(c.cpu is None for c in chunks):
        return None
    return sum(c.cpu or 0.0 for c in chunks) / n * 1e6


def drift(chunks: list[ChunkLoad], window: int) -> tuple[float | None, float | None, int, int]:
    """CPU us per EVENT over the first and the last `window` events loaded (whole chunks),
    with the number of events each covers."""
    if not chunks:
        return None, None, 0, 0
    total = chunks[-1].end
    first = [c for c in chunks if c.end <= window] or chunks[:1]
    last = [c for c in chunks if c.start >= total - window] or chunks[-1:]
    return (
        _per_event(first),
        _per_event(last),
        sum(c.events for c in first),
        sum(c.events for c in last),
    )


# --- report -------------------------------------------------------------------------


def size_label(x: int) -> str:
    if x >= 1_000_000 and x % 1_000_000 == 0:
        return f"{x // 1_000_000}M"
    if x >= 1000 and x % 1000 == 0:
        return f"{x // 1000}k"
    return f"{x:,}"


def _mb(b: int) -> str:
    return f"{b / 2**20:,.1f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def target_met(small: float | None, large: float | None) -> str:
    if small is None or large is None:
        return "-"
    return "met" if large <= max(2 * small, TARGET_FLOOR_MS) else "**missed**"


def corpus_report(run: CorpusRun, chunk: int) -> list[str]:
    """One corpus: latency per shape and size, the store at each size, the load, and
    every relation at the largest size."""
    lines = [f"### corpus: {run.corpus}", "", *_shape_table(run.steps)]
    lines += ["", *_store_table(run.steps)]
    lines += ["", *_load_lines(run, chunk)]
    lines += ["", *_relations_table(run)]
    if run.kept:
        lines += ["", f"- kept: {run.kept}"]
    return lines


def _shape_table(steps: list[Step]) -> list[str]:
    """p50 / p99 (CPU) of every shape at every size, the p99 growth and its target; then
    the outcomes other than EOSE or COUNT."""
    first, last = steps[0], steps[-1]
    head = ["shape", f"events with the value at {size_label(last.size)}"]
    head += [f"{size_label(s.size)} p50 / p99 ms (CPU us)" for s in steps]
    if len(steps) > 1:
        head += [
            f"p99 {size_label(last.size)}/{size_label(first.size)}",
            f"p99 <= max(2x {size_label(first.size)}, {TARGET_FLOOR_MS:g} ms)",
        ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes: list[str] = []
    for shape in SHAPES:
        m = last.shapes[shape].matches if shape in last.shapes else None
        cells = [f"`{shape}`", "-" if m is None else f"{m[0]:,}-{m[1]:,}"]
        for s in steps:
            r = s.shapes.get(shape, Shape())
            cpu = "-" if r.cpu_us is None else f"{r.cpu_us:.0f}"
            cells.append(f"{_ms(r.p50)} / {_ms(r.p99)} ({cpu})")
            for why, n in r.outcomes.items():
                if why not in ("EOSE", "COUNT"):
                    notes.append(f"- {size_label(s.size)} `{shape}`: {n} x {why}")
        if len(steps) > 1:
            a, b = first.shapes.get(shape, Shape()).p99, last.shapes.get(shape, Shape()).p99
            cells.append(f"{b / a:.2f}" if a and b else "-")
            cells.append(target_met(a, b))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + (["", *notes] if notes else [])


def _store_table(steps: list[Step]) -> list[str]:
    """Rows, load time, ingest rate, CPU per EVENT and bytes on disk at each size."""
    lines = [
        "| store | rows | load s | ingest ev/s | CPU us/EVENT | data dir MB | WAL MB"
        " | database MB | events MB | event_tags MB | bytes/event (dir) | bytes/event (db) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        loaded = sum(c.events for c in s.chunks)
        rate = loaded / s.load_wall if s.load_wall else 0.0
        cpu = s.cpu_per_event()
        d = s.disk
        lines.append(
            f"| {size_label(s.size)} | {s.rows:,} | {s.load_wall:.1f} | {rate:,.0f} |"
            f" {'-' if cpu is None else f'{cpu:.0f}'} | {_mb(d.datadir)} | {_mb(d.wal)} |"
            f" {_mb(d.database)} | {_mb(d.table('events'))} | {_mb(d.table('event_tags'))} |"
            f" {d.datadir / s.size:,.0f} | {d.database / s.size:,.0f} |"
        )
    return lines


def _load_lines(run: CorpusRun, chunk: int) -> list[str]:
    """The whole load: rate, CPU per EVENT first against last (the drift target), per
    chunk, the VACUUM ANALYZE times and the EVENTs refused."""
    last = run.steps[-1]
    lo, hi, n_lo, n_hi = drift(run.chunks, chunk)
    total_wall = sum(c.wall for c in run.chunks)
    lines = [
        f"- load: {last.size:,} events in {total_wall:.1f} s of ingest"
        f" ({last.size / total_wall if total_wall else 0:,.0f} ev/s);"
        + (
            f" relay+PostgreSQL CPU per EVENT {lo:.0f} us over the first {n_lo:,} events,"
            f" {hi:.0f} us over the last {n_hi:,}: {hi / lo:.2f}x"
            f" (target <= {DRIFT_TARGET}x: {'met' if hi / lo <= DRIFT_TARGET else '**missed**'})"
            if lo and hi
            else " CPU per EVENT not measured"
        ),
        "- CPU us/EVENT per chunk: "
        + ", ".join(
            f"{size_label(c.end)} {c.cpu / c.events * 1e6:.0f}"
            for c in run.chunks
            if c.cpu is not None
        ),
        "- VACUUM ANALYZE before timing: "
        + ", ".join(f"{size_label(s.size)} {s.vacuum_seconds:.1f} s" for s in run.steps),
    ]
    errors = Counter[str]()
    for c in run.chunks:
        errors.update(c.errors)
    for why, n in errors.most_common(5):
        lines.append(f"- EVENTs refused: {n} x {why}")
    return lines


def _relations_table(run: CorpusRun) -> list[str]:
    """Every relation at the largest size with its bytes per event and `idx_scan`."""
    last = run.steps[-1]
    lines = [
        f"Relations at {size_label(last.size)} ({run.corpus}), `idx_scan` counted over the"
        " whole run (loading included):",
        "",
        "| table | relation | MB | bytes/event | idx_scan |",
        "|---|---|---|---|---|",
    ]
    scans = {(t, i): n for t, i, _, n in run.indexes}
    for table, rel, size in last.disk.relations:
        used = scans.get((table, rel))
        lines.append(
            f"| {table} | {rel} | {_mb(size)} | {size / last.size:,.0f} |"
            f" {'' if used is None else f'{used:,}'} |"
        )
    return lines


def report(
    runs: list[CorpusRun],
    argv: list[str],
    reps: int,
    via: str,
    chunk: int,
    loadavg: tuple[tuple[float, ...], tuple[float, ...]],
) -> str:

    how = (
        "signed EVENTs and REQs through `engram serve`'s websocket (8 connections x 100"
        " EVENTs in flight, one write per message; REQs one at a time on one connection)"
        if via == "ws"
        else "PostgresStore.submit/query/count in this process (no websocket, no signatures)"
    )
    lines = [
        *run_lines("scale", argv, runs[0].server if runs else "", loadavg),
        f"- {how}; {reps} runs per shape and size after {WARMUP} unrecorded; CPU per query is"
        " relay+PostgreSQL (process trees); a cell's CPU divides by the runs",
        "",
    ]
    for run in runs:
        lines += [*corpus_report(run, chunk), ""]
    return "\n".join(lines).rstrip()


def write_charts(runs: list[CorpusRun], directory: Path) -> list[Path]:
    out = []
    for run in runs:
        if len(run.steps) < 2:
            continue
        xs = [float(s.size) for s in run.steps]
        p = charts.lines(
            directory / f"scale-p99-{run.corpus}.png",
            f"p99 REQ -> EOSE through the websocket, {run.corpus} corpus (ms)",
            xs,
            {q: [s.shapes[q].p99 if q in s.shapes else None for s in run.steps] for q in SHAPES},
            "events in the store",
            "p99 ms",
            limit=TARGET_FLOOR_MS,
        )
        if p:
            out.append(p)
        p = charts.lines(
            directory / f"scale-cpu-{run.corpus}.png",
            f"relay+PostgreSQL CPU per query, {run.corpus} corpus (us)",
            xs,
            {q: [s.shapes[q].cpu_us if q in s.shapes else None for s in run.steps] for q in SHAPES},
            "events in the store",
            "CPU us per query",
        )
        if p:
            out.append(p)
    chunks = [r.chunks for r in runs]
    if chunks and len(chunks[0]) > 1 and all(len(c) == len(chunks[0]) for c in chunks):
        p = charts.lines(
            directory / "scale-ingest.png",
            "relay+PostgreSQL CPU per EVENT of each loaded chunk (us)",
            [float(c.end) for c in chunks[0]],
            {
                r.corpus: [c.cpu / c.events * 1e6 if c.cpu is not None else None for c in r.chunks]
                for r in runs
            },
            "events in the store after the chunk",
            "CPU us per EVENT",
        )
        if p:
            out.append(p)
    return out
