"""How a request finds its Ray Serve replica (deploy/ray_serve.py): the chain of digests of its
prompt's prefixes (affinity_keys, computed by the front), and the AffinityRouter, which sends it
to the replica that served the longest of them unless that one is busy past a bound."""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import FIFOMixin, RequestRouter

from .ray_peers import REPLICA_KEY

BLOCK_CHARS = 256  # a completions prompt's text is keyed in blocks of this many characters
BLOCK_TOKENS = 64  # ... a prompt of token ids in blocks of this many ids
MAX_KEYS = 200_000  # digests the router remembers (oldest forgotten first)


def affinity_keys(path: str, body: bytes) -> list[str]:
    """Digests of the request's prompt prefixes, shortest first: one per chat message, or per
    full block of a completions prompt, each covering everything before it and the model name.
    A later turn of a conversation repeats the earlier turns, so its chain starts with theirs.
    A body that is not a completions or chat request has none (Ray's own routing)."""
    try:
        data = json.loads(body)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    parts: list[bytes] = []
    if path.endswith("/chat/completions") and isinstance(data.get("messages"), list):
        parts = [json.dumps(m, sort_keys=True).encode() for m in data["messages"]]
    elif path.endswith("/completions"):
        prompt = data.get("prompt")
        if isinstance(prompt, str):
            parts = [prompt[i : i + BLOCK_CHARS].encode() for i in range(0, len(prompt) - BLOCK_CHARS + 1, BLOCK_CHARS)]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            n = len(prompt) - len(prompt) % BLOCK_TOKENS
            parts = [json.dumps(prompt[i : i + BLOCK_TOKENS]).encode() for i in range(0, n, BLOCK_TOKENS)]
    h = hashlib.blake2b(str(data.get("model", "")).encode(), digest_size=16)
    keys = []
    for part in parts:
        h.update(len(part).to_bytes(8, "little") + part)
        keys.append(h.hexdigest())
    return keys


# --- the router (runs in the front's process, inside its deployment handle) --------------------


class AffinityRouter(FIFOMixin, RequestRouter):  # type: ignore[misc]
    """The replica that served the longest known prefix of the request, if it has fewer than
    `bound` requests in hand (then the others as a second choice); otherwise two replicas at
    random, of which Ray takes the one with fewer requests in hand."""

    def initialize_state(self, bound: int = 8, **kwargs: Any) -> None:
        super().initialize_state(**kwargs)
        self.bound = bound
        self.holders: OrderedDict[str, Any] = OrderedDict()  # prefix digest -> replica id

    async def choose_replicas(self, candidate_replicas: list[Any], pending_request: Any = None) -> list[list[Any]]:
        keys = _keys(pending_request)
        if keys and keys[0].startswith(REPLICA_KEY):  # a call for one replica (ray_peers: its states)
            named = [r for r in candidate_replicas if str(r.replica_id.unique_id) == keys[0][len(REPLICA_KEY) :]]
            return [named or candidate_replicas]  # gone: another one answers that it is not the one
        by_id = {r.replica_id: r for r in candidate_replicas}
        for key in reversed(keys):
            holder = by_id.get(self.holders.get(key))
            if holder is None:
                continue
            rest = [r for r in candidate_replicas if r is not holder]
            in_hand = self.replica_queue_len_cache.get(holder.replica_id)
            if in_hand is not None and in_hand >= self.bound and rest:
                return [random.sample(rest, min(2, len(rest))), [holder]]  # busy: prefill elsewhere
            return [[holder], rest] if rest else [[holder]]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        for key in [k for k in _keys(pending_request) if not k.startswith(REPLICA_KEY)]:
            self.holders[key] = replica_id
            self.holders.move_to_end(key)
        while len(self.holders) > MAX_KEYS:
            self.holders.popitem(last=False)

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        for key in [k for k, v in self.holders.items() if v == replica_id]:
            del self.holders[key]


def _keys(pending_request: Any) -> list[str]:
    args = getattr(pending_request, "args", None) or ()
    return list(args[0]) if args and isinstance(args[0], list) else []
