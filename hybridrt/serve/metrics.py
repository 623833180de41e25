"""Prometheus metrics, each set in a registry of its own (several servers can share a process):
`Metrics` of one engine (one served model), `ServerMetrics` of the HTTP layer (requests by route
and status, latencies per model, requests, tokens and latency per route and variant). `render`
writes them all; with several models, each engine's series carry a `model` label."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..runtime.prefix_cache import StateCache

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self) -> None:
        disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "hybridrt_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "hybridrt_request_seconds",
            "End to end, from the request's arrival to its last byte, by model",
            ["model"],
            buckets=LATENCY_BUCKETS + (60.0, 120.0, 300.0),
            registry=r,
        )
        self.queue_wait = Histogram(
            "hybridrt_queue_wait_seconds",
            "From submission until a state slot is free, by model",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.routed = Counter(
            "hybridrt_route_requests",
            "Requests to a routed name, by route and variant",
            ["route", "variant"],
            registry=r,
        )
        self.routed_tokens = Counter(
            "hybridrt_route_completion_tokens",
            "Tokens generated for a route's requests",
            ["route", "variant"],
            registry=r,
        )
        self.routed_seconds = Histogram(
            "hybridrt_route_request_seconds",
            "End to end, by route and variant",
            ["route", "variant"],
            buckets=LATENCY_BUCKETS + (60.0, 120.0, 300.0),
            registry=r,
        )


class _Labelled(Collector):
    """The engines' series as one set of families, each sample labelled with its model."""

    def __init__(self, engines: dict[str, Metrics]) -> None:
        self.engines = engines

    def collect(self) -> list[Metric]:
        families: dict[str, Metric] = {}
        for model, metrics in self.engines.items():
            for family in metrics.registry.collect():
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    merged.samples.append(sample._replace(labels={**sample.labels, "model": model}))
        return list(families.values())


def render(server: ServerMetrics, engines: dict[str, Metrics]) -> bytes:
    """The Prometheus text of the HTTP layer and every engine (one engine: its series unlabelled)."""
    for metrics in engines.values():
        metrics.observe_cache(metrics.cache)
    if len(engines) == 1:
        return generate_latest(server.registry) + generate_latest(next(iter(engines.values())).registry)
    merged = CollectorRegistry()
    merged.register(_Labelled(engines))
    return generate_latest(server.registry) + generate_latest(merged)


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series next to each counter (process-wide switch)
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter("hybridrt_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generated_tokens = Counter("hybridrt_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "hybridrt_time_to_first_token_seconds",
            "From submission to the first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "hybridrt_inter_token_seconds",
            "Between consecutive tokens of a request",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("hybridrt_queue_depth", "Requests waiting for a state slot", registry=r)
        self.busy_slots = Gauge("hybridrt_busy_slots", "State slots held by requests", registry=r)
        self.slots = Gauge("hybridrt_slots", "State slots in the pool", registry=r)
        self.cache_hits = Counter("hybridrt_prefix_cache_hits", "Requests that started from cached states", registry=r)
        self.cache_misses = Counter("hybridrt_prefix_cache_misses", "Requests that prefilled from scratch", registry=r)
        self.cache_hit_tokens = Counter("hybridrt_prefix_cache_hit_tokens", "Prompt tokens not prefilled", registry=r)
        self.cache_bytes = Gauge(
            "hybridrt_prefix_cache_bytes", "Bytes of states the prefix cache holds in memory", registry=r
        )
        self.cache_entries = Gauge(
            "hybridrt_prefix_cache_entries", "States in the prefix cache (memory and disk)", registry=r
        )
        self.cache_budget = Gauge("hybridrt_prefix_cache_budget_bytes", "The prefix cache's memory budget", registry=r)
        self.cache_disk_bytes = Gauge(
            "hybridrt_prefix_cache_disk_bytes", "Bytes of states in the disk tier", registry=r
        )
        self.cache_disk_budget = Gauge("hybridrt_prefix_cache_disk_budget_bytes", "The disk tier's cap", registry=r)
        self.cache_state_bytes = Gauge(
            "hybridrt_prefix_cache_state_bytes", "Bytes of fixed-size states in each stored checkpoint", registry=r
        )
        self._cache_counters = {
            name: Counter(f"hybridrt_prefix_cache_{name}", help, registry=r)
            for name, help in (
                ("checkpoints", "States stored (inside prompts, at prompt and reply ends)"),
                ("evictions", "States that left memory (to disk, with a disk tier)"),
                ("disk_writes", "States written to the disk tier"),
                ("disk_reads", "States read back from the disk tier"),
                ("saved_prefill_seconds", "Prefill seconds saved by cached states (at the measured rate)"),
            )
        }
        self._cache_seen: dict[str, float] = {}
        self.cache: StateCache | None = None  # read at each scrape, never on the engine's turns
        self.drafted_tokens = Counter(
            "hybridrt_speculative_drafted_tokens", "Tokens the assistant model proposed", registry=r
        )
        self.accepted_tokens = Counter(
            "hybridrt_speculative_accepted_tokens", "Proposed tokens the model kept", registry=r
        )

    def observe_cache(self, cache: StateCache | None) -> None:
        """Bring the prefix cache's gauges and counters up to date (render calls it)."""
        if cache is None:
            return
        self.cache_bytes.set(cache.memory)
        self.cache_entries.set(len(cache))
        self.cache_budget.set(cache.memory_bytes)
        self.cache_disk_bytes.set(cache.disk)
        self.cache_disk_budget.set(0 if cache.files is None else cache.files.cap)
        self.cache_state_bytes.set(cache.state_bytes)
        stats = cache.stats
        for name, counter in self._cache_counters.items():
            value = float(getattr(stats, name.replace("saved_prefill_seconds", "saved_seconds")))
            delta = value - self._cache_seen.get(name, 0.0)
            if delta > 0:
                counter.inc(delta)
            self._cache_seen[name] = value

    def render(self) -> bytes:
        self.observe_cache(self.cache)
        return generate_latest(self.registry)
