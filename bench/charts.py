"""Charts for `bench compare` and `bench scale`, written next to bench/RESULTS.md.

matplotlib is an optional extra (`pip install -e '.[plot]'` in the repository): without it every
function here returns None and the caller says the charts were skipped; the benchmarks
themselves never need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

SKIPPED = "charts skipped: matplotlib is not installed (pip install -e '.[plot]' in the repository)"


def _pyplot() -> Any | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def bars(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float | None]],
    ylabel: str,
    log: bool = False,
) -> Path | None:
    """Grouped bars: one group per x label (a phase), one bar per series (a relay)."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(groups) + 2), 4.2))
    n = max(1, len(series))
    width = 0.8 / n
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (n - 1) / 2) * width for i in range(len(groups))]
        ys = [0.0 if v is None else v for v in values]
        rects = ax.bar(xs, ys, width, label=name)
        ax.bar_label(rects, labels=[_short(v) for v in values], fontsize=7, padding=2)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
        _plain_ticks(ax.yaxis)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


def lines(
    path: Path,
    title: str,
    xs: Sequence[float],
    series: dict[str, Sequence[float | None]],
    xlabel: str,
    ylabel: str,
    limit: float | None = None,
) -> Path | None:
    """One line per series over a log x axis (e.g. p99 per query against store size)."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (name, ys) in enumerate(series.items()):
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if pts:  # past the 10 colours of the cycle, the next 10 dashed, then dotted
            style = ("-", "--", ":")[i // 10 % 3]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=name)
    if limit is not None:
        ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"target {limit:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_ticks(ax.yaxis)
    ax.set_xticks(list(xs), [_size(x) for x in xs])
    ax.xaxis.set_minor_locator(_no_ticks())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    return _save(plt, fig, path)


def _plain_ticks(axis: Any) -> None:
    """1, 2, 5, 10 ... instead of 10^0 and 2x10^1 on a log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _no_ticks() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def _save(plt: Any, fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format=path.suffix.lstrip(".") or "png", dpi=110)
    plt.close(fig)
    return path


def _short(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    return f"{v:.3g}"


def _size(x: float) -> str:
    if x >= 1_000_000:
        return f"{x / 1_000_000:g}M"
    if x >= 1000:
        return f"{x / 1000:g}k"
    return f"{x:g}"
