"""Prometheus metrics of one server, in a registry of its own (several servers can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series next to each counter (process-wide switch)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "hybridrt_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
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
        self.cache_bytes = Gauge("hybridrt_prefix_cache_bytes", "Bytes of states in the prefix cache", registry=r)
        self.cache_entries = Gauge("hybridrt_prefix_cache_entries", "Entries in the prefix cache", registry=r)
        self.drafted_tokens = Counter(
            "hybridrt_speculative_drafted_tokens", "Tokens the assistant model proposed", registry=r
        )
        self.accepted_tokens = Counter(
            "hybridrt_speculative_accepted_tokens", "Proposed tokens the model kept", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
