"""The `core` page's picture: memories reachable from core, orphans and dangling links.

Laid out here (positions only; the template draws the SVG, escaping every label): core
in the first column, each reachable memory in the column of its distance from core,
then a column of orphans and one of dangling targets. Which memory is reachable, orphan
or dangling is `engram.reachability`'s answer; this module only places the boxes.

Bounded, since the agent writes as many memories and links as it likes: at most
`MAX_NODES` boxes and `MAX_EDGES` links are drawn (the picture counts the rest, and the
page links to the list, which has them all), and only the drawn boxes' links are
walked.
"""

from __future__ import annotations

from dataclasses import dataclass

from cli.memory.review.snapshot import Snapshot
from engram import CORE_SLUG

BOX_W = 230
BOX_H = 26
COL_GAP = 80
ROW_GAP = 10
TOP = 34  # room for the column titles
LABEL_CHARS = 30
MAX_NODES = 150  # a bigger memory is drawn in part, and the page says so
MAX_EDGES = 400  # links drawn at most (each a path); the rest are counted
LANE_GAP = 7  # between the lanes under the boxes that longer links follow
MAX_LANES = 24  # lanes are reused past this many longer links


@dataclass(frozen=True)
class Node:
    slug: str
    label: str
    kind: str  # "core" | "live" | "orphan" | "dangling"
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    path: str  # SVG path data
    kind: str  # "link" | "dangling"


@dataclass(frozen=True)
class Picture:
    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]
    titles: list[tuple[int, str]]  # (x, column title)
    shown: int
    total: int
    links_shown: int = 0
    links_total: int = 0  # links between live memories and to dangling targets

    @property
    def box_w(self) -> int:
        return BOX_W

    @property
    def box_h(self) -> int:
        return BOX_H


def label(slug: str) -> str:
    if len(slug) <= LABEL_CHARS:
        return slug
    keep = LABEL_CHARS - 1
    return slug[: keep // 2] + "…" + slug[-(keep - keep // 2) :]


def layout(snapshot: Snapshot) -> Picture:
    reachable, orphans, dangling = snapshot.graph
    depth: dict[str, int] = {CORE_SLUG: 0}
    queue = [CORE_SLUG] if snapshot.core is not None else []
    live = set(reachable)
    for slug in queue:  # breadth first over the same links reachability followed
        for target in snapshot.edges.get(slug, []):
            if target in live and target not in depth:
                depth[target] = depth[slug] + 1
                queue.append(target)
    columns: list[tuple[str, list[tuple[str, str]]]] = [
        ("core" if snapshot.core is not None else "no core", [(CORE_SLUG, "core")])
    ]
    deepest = max((depth[s] for s in reachable if s in depth), default=0)
    for level in range(1, deepest + 1):
        members = [(s, "live") for s in reachable if depth.get(s) == level]
        columns.append((f"{level} link{'s' if level > 1 else ''} from core", members))
    if orphans:
        columns.append(("orphans: not reachable from core", [(s, "orphan") for s in orphans]))
    targets = list(dict.fromkeys(t for _, t in dangling))
    if targets:
        columns.append(("dangling: no live memory", [(t, "dangling") for t in targets]))

    total = sum(len(m) for _, m in columns)
    nodes: list[Node] = []
    where: dict[str, Node] = {}
    titles: list[tuple[int, str]] = []
    budget = MAX_NODES
    for col, (title, members) in enumerate(columns):
        x = 10 + col * (BOX_W + COL_GAP)
        titles.append((x, title))
        for row, (slug, kind) in enumerate(members[:budget]):
            if kind == "core" and snapshot.core is None:
                kind = "dangling"
            node = Node(slug, label(slug), kind, x, TOP + row * (BOX_H + ROW_GAP))
            nodes.append(node)
            where.setdefault(slug, node)
        budget -= min(len(members), budget)

    grid_bottom = max((n.y for n in nodes), default=TOP) + BOX_H
    edges: list[Edge] = []
    lanes = 0
    column_of = {n.slug: n.x for n in nodes}
    for source, targets_of in snapshot.edges.items():
        a = where.get(source)
        if a is None or len(edges) >= MAX_EDGES:
            continue
        for target in targets_of:
            b = where.get(target)
            if b is None or b is a:
                continue
            if len(edges) >= MAX_EDGES:
                break
            kind = "dangling" if b.kind == "dangling" else "link"
            if column_of[target] - column_of[source] == BOX_W + COL_GAP:
                edges.append(Edge(_curve(a, b), kind))
            else:
                edges.append(Edge(_detour(a, b, lanes, grid_bottom), kind))
                lanes += 1
    links = sum(len(targets) for targets in snapshot.edges.values())
    width = 20 + len(columns) * (BOX_W + COL_GAP) - COL_GAP
    height = grid_bottom + 20 + min(lanes, MAX_LANES) * LANE_GAP
    return Picture(width, height, nodes, edges, titles, len(nodes), total, len(edges), links)


def _curve(a: Node, b: Node) -> str:
    """A link to the next column: a curve across the gap between the two."""
    x1, y1 = a.x + BOX_W, a.y + BOX_H // 2
    x2, y2 = b.x, b.y + BOX_H // 2
    bow = COL_GAP // 2
    return f"M{x1},{y1} C{x1 + bow},{y1} {x2 - bow},{y2} {x2},{y2}"


def _detour(a: Node, b: Node, lane: int, grid_bottom: int) -> str:
    """Any other link (skipping columns, within one, or backwards) goes around the boxes:
    out into the gap right of `a`, down to a lane of its own under every box, along it,
    and up the gap left of `b` into its left edge. Boxes never sit in gaps or lanes."""
    step = lane % MAX_LANES
    x1, y1 = a.x + BOX_W, a.y + BOX_H // 2
    x2, y2 = b.x, b.y + BOX_H // 2
    out = x1 + 8 + (step * 7) % (COL_GAP // 2 - 8)
    back = x2 - 8 - (step * 7) % (COL_GAP // 2 - 8)
    below = grid_bottom + 14 + step * LANE_GAP
    return f"M{x1},{y1} H{out} V{below} H{back} V{y2} H{x2}"
