"""Routes: served model names that stand for a choice between served models.

- A length route sends a request to `short` when its longest prompt has fewer than `threshold`
  tokens (counted with `short`'s tokenizer), else to `long`: runtime.router's rule, served.
- A split route sends each request to one of its variants with probability proportional to the
  variant's weight; a request that names its user (the body's `user`, else the
  `X-Hybridrt-User` header) always gets the same variant, from a hash of the route and the user,
  so one user sees one model. A request with no user draws at random.

The server answers with the choice in the `X-Hybridrt-Route` header (`route=variant`), counts
requests, tokens and latency per route and variant in /metrics, and writes both in the request's
log line. `parse_route` reads the command line's forms:

    NAME=length:SHORT,LONG,THRESHOLD        e.g. auto=length:llama,jamba,1024
    NAME=split:MODEL:WEIGHT,MODEL:WEIGHT    e.g. ab=split:int4:90,int8:10
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import GenerationError
from ..runtime.router import length_route

USER_HEADER = "x-hybridrt-user"
ROUTE_HEADER = "x-hybridrt-route"


@dataclass(frozen=True)
class LengthRoute:
    name: str
    short: str
    long: str
    threshold: int

    @property
    def models(self) -> tuple[str, ...]:
        return (self.short, self.long)

    def choose(self, prompt_tokens: int) -> str:
        """The served model for a request whose longest prompt has `prompt_tokens` tokens."""
        return self.long if length_route(prompt_tokens, self.threshold) == "long" else self.short


@dataclass(frozen=True)
class SplitRoute:
    name: str
    variants: tuple[tuple[str, float], ...]  # (served model, weight > 0)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(m for m, _ in self.variants)

    def choose(self, user: str | None, draw: Callable[[], float] = random.random) -> str:
        """The variant of `user` (sticky), or a weighted draw for a request without one."""
        if user is None:
            point = draw()
        else:
            digest = hashlib.sha256(f"{self.name}\0{user}".encode()).digest()
            point = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
        total = sum(w for _, w in self.variants)
        edge = 0.0
        for model, weight in self.variants:
            edge += weight / total
            if point < edge:
                return model
        return self.variants[-1][0]


ServedRoute = LengthRoute | SplitRoute


def parse_route(spec: str) -> ServedRoute:
    """A route from its command-line form (see the module docstring); GenerationError if malformed."""
    name, sep, rule = spec.partition("=")
    kind, sep2, rest = rule.partition(":")
    if not (sep and sep2 and name and rest):
        raise GenerationError(
            f"route {spec!r}: expected NAME=length:SHORT,LONG,THRESHOLD or NAME=split:MODEL:WEIGHT,MODEL:WEIGHT"
        )
    parts = rest.split(",")
    if kind == "length":
        if len(parts) != 3 or not parts[2].isdigit() or int(parts[2]) < 1:
            raise GenerationError(f"route {spec!r}: a length route is NAME=length:SHORT,LONG,THRESHOLD (tokens >= 1)")
        return LengthRoute(name, parts[0], parts[1], int(parts[2]))
    if kind == "split":
        variants = []
        for part in parts:
            model, _, weight = part.rpartition(":")
            try:
                value = float(weight)
            except ValueError:
                value = -1.0
            if not model or not value > 0:
                raise GenerationError(f"route {spec!r}: each variant is MODEL:WEIGHT with a weight > 0, got {part!r}")
            variants.append((model, value))
        if len(variants) < 2:
            raise GenerationError(f"route {spec!r}: a split route needs at least two variants")
        return SplitRoute(name, tuple(variants))
    raise GenerationError(f"route {spec!r}: unknown kind {kind!r}; use length or split")


def check_routes(routes: Sequence[ServedRoute], models: Sequence[str]) -> None:
    """Every route names served models (not other routes), and no name is taken twice."""
    names = list(models) + [r.name for r in routes]
    taken = sorted({n for n in names if names.count(n) > 1})
    if taken:
        raise GenerationError(f"served names must be unique: {', '.join(taken)} named twice")
    for route in routes:
        unknown = [m for m in route.models if m not in models]
        if unknown:
            raise GenerationError(
                f"route {route.name!r} names {', '.join(unknown)}, which is not a served model; "
                f"served: {', '.join(models)}"
            )
