"""Route enumeration for `lineage paths` / reroute: lazy Yen (networkx shortest_simple_paths from a
virtual root, first 200 routes) vs the naive baseline (every simple path, then sort by cost).

    .venv/bin/python bench/lineage_routes.py [--layers 6] [--width 6]

A layered graph: `width` alternative datasets per layer, every dataset feeding every dataset of
the next layer (width^layers routes into the last dataset).
"""

from __future__ import annotations

import argparse
import random
import time

import networkx as nx

from lakehouse.lineage.graph import _ROOT, MAX_ROUTES, routes


def layered(layers: int, width: int, seed: int = 1) -> nx.DiGraph:
    rng = random.Random(seed)
    g = nx.DiGraph()
    prev = [f"src_{i}" for i in range(width)]
    for layer in range(1, layers):
        cur = [f"l{layer}_{i}" for i in range(width)]
        for a in prev:
            for b in cur:
                g.add_edge(a, b, cost=float(rng.randint(1, 9)), is_default=rng.random() < 0.2)
        prev = cur
    for a in prev:
        g.add_edge(a, "target", cost=1.0, is_default=True)
    return g


def naive(g: nx.DiGraph, target: str) -> list[tuple[float, list[str]]]:
    origins = [n for n in g if g.in_degree(n) == 0]
    out = []
    for o in origins:
        for p in nx.all_simple_paths(g, o, target):
            out.append((sum(g.edges[a, b]["cost"] for a, b in zip(p, p[1:], strict=False)), p))
    out.sort(key=lambda x: x[0])
    return out[:MAX_ROUTES]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=6)
    a = ap.parse_args()
    g = layered(a.layers, a.width)
    assert _ROOT not in g
    t0 = time.perf_counter()
    base = naive(g, "target")
    t_naive = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = routes(g, "target")
    t_yen = time.perf_counter() - t0
    assert [r.cost for r in ours] == [c for c, _ in base], "both must list the same cheapest routes"
    total = a.width ** a.layers
    print(f"graph: {g.number_of_nodes()} datasets, {g.number_of_edges()} edges, {total} routes into target")
    print(f"naive all_simple_paths + sort : {t_naive:8.3f} s")
    print(f"lazy Yen, first {MAX_ROUTES} routes  : {t_yen:8.3f} s")
    print(f"speed-up: {t_naive / t_yen:.1f}x")


if __name__ == "__main__":
    main()
