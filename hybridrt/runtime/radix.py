"""A radix tree over token ids: which stored prefixes a token sequence starts with, and how far
it agrees with anything stored.

Each node's edge is the run of tokens from its parent to it (runs are split where two stored
sequences part), so a lookup compares runs, not single tokens, and a long shared system prompt
is one edge. A node may hold a value (the prefix state cache's entries: runtime.prefix_cache)
at its depth, the number of tokens from the root.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(eq=False)
class Node(Generic[V]):
    edge: tuple[int, ...]
    depth: int
    parent: Node[V] | None = None
    children: dict[int, Node[V]] = field(default_factory=dict)
    value: V | None = None

    def key(self) -> list[int]:
        """The tokens from the root to this node."""
        parts: list[tuple[int, ...]] = []
        node: Node[V] | None = self
        while node is not None:
            parts.append(node.edge)
            node = node.parent
        return [t for edge in reversed(parts) for t in edge]

    def above(self) -> Node[V] | None:
        """The nearest node above this one that holds a value (None: none)."""
        node = self.parent
        while node is not None and node.value is None:
            node = node.parent
        return node

    def held_above(self) -> int:
        """The depth of the nearest node above this one that holds a value (0: none)."""
        node = self.above()
        return 0 if node is None else node.depth


@dataclass(frozen=True)
class Match(Generic[V]):
    """What a lookup found: `agree`, how many leading tokens agree with a stored sequence; the
    stored values on that path at or before it, deepest first (node, value)."""

    agree: int
    path: list[tuple[Node[V], V]]
    # The node where the agreement ends (its edge may go on past `agree`).
    end: Node[V]


class RadixTree(Generic[V]):
    def __init__(self) -> None:
        self.root: Node[V] = Node((), 0)
        self.size = 0  # nodes holding a value

    def insert(self, tokens: Sequence[int], value: V) -> tuple[Node[V], V | None]:
        """Store `value` at `tokens`; returns its node and the value it replaced, if any."""
        node, i, tokens = self.root, 0, tuple(tokens)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                leaf = Node(tokens[i:], len(tokens), node)
                node.children[tokens[i]] = leaf
                node, i = leaf, len(tokens)
                break
            n = _agree(child.edge, tokens, i)
            if n < len(child.edge):
                child = self._split(child, n)
            node, i = child, i + n
        old = node.value
        node.value = value
        self.size += old is None
        return node, old

    def match(self, tokens: Sequence[int]) -> Match[V]:
        """Walk `tokens` down the tree (see Match)."""
        node, i, path = self.root, 0, []
        while True:
            if node.value is not None:
                path.append((node, node.value))
            if i == len(tokens):
                break
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = _agree(child.edge, tokens, i)
            i += n
            if n < len(child.edge):
                node = child
                break
            node = child
        path.reverse()
        return Match(i, path, node)

    def remove(self, node: Node[V]) -> None:
        """Drop node's value; nodes left holding nothing are pruned or merged into their child."""
        if node.value is None:
            return
        node.value = None
        self.size -= 1
        while node is not self.root and node.value is None and len(node.children) <= 1:
            parent = node.parent
            assert parent is not None
            if node.children:  # one child: it takes this node's place, its edge longer
                (child,) = node.children.values()
                child.edge = node.edge + child.edge
                child.parent = parent
                parent.children[node.edge[0]] = child
                return
            del parent.children[node.edge[0]]
            node = parent

    def values(self) -> Iterator[tuple[Node[V], V]]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.value is not None:
                yield node, node.value
            stack.extend(node.children.values())

    def below(self, node: Node[V]) -> Iterator[tuple[Node[V], V]]:
        """Stored values at or under `node` (shallowest first)."""
        level = [node]
        while level:
            for n in level:
                if n.value is not None:
                    yield n, n.value
            level = [c for n in level for c in n.children.values()]

    def _split(self, child: Node[V], n: int) -> Node[V]:
        """Cut child's edge after n tokens: a new node there, child under it."""
        parent = child.parent
        assert parent is not None
        mid = Node(child.edge[:n], child.depth - len(child.edge) + n, parent)
        parent.children[child.edge[0]] = mid
        child.edge = child.edge[n:]
        child.parent = mid
        mid.children[child.edge[0]] = child
        return mid


def _agree(edge: tuple[int, ...], tokens: tuple[int, ...] | Sequence[int], start: int) -> int:
    """How many leading tokens of `edge` equal tokens[start:]."""
    n = min(len(edge), len(tokens) - start)
    if tuple(tokens[start : start + n]) == edge[:n]:
        return n
    lo, hi = 0, n  # the first difference, by halving (tuple slices compare in C)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(tokens[start : start + mid]) == edge[:mid]:
            lo = mid
        else:
            hi = mid
    return lo if edge[lo] != tokens[start + lo] else hi


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    return _agree(tuple(a), tuple(b), 0) if a and b else 0
