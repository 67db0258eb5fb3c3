"""``GET /metrics``: Prometheus text, names in the ``ferrolm:`` namespace after SGLang's
and vLLM's. The engine core keeps the counters and latency samples; each scrape asks the
engine process for them once, feeds the new latency samples into histograms here and
reports the counters and gauges as the core has them (so they never drift).

Beside them, the load and prefix-cache figures under the ``vllm:`` names (and labels,
``model_name`` and ``engine``) that cache-aware routers scrape from vLLM replicas (Dynamo,
llm-d's scorers, the Gateway API inference extension), so a ferrolm replica drops into
such a fleet unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ferrolm.server.engine_client import EngineUnavailable
from ferrolm.server.state import state_of

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# core counter -> (metric name without _total, help)
_COUNTERS = {
    "prompt_tokens": ("ferrolm:prompt_tokens", "Prompt tokens of admitted requests."),
    "generation_tokens": ("ferrolm:generation_tokens", "Generated tokens."),
    "cache_hit_tokens": ("ferrolm:cache_hit_tokens", "Prompt tokens found in the prefix cache."),
    "retractions": ("ferrolm:num_retractions", "Running requests retracted (preempted) under KV pressure."),
    "finished": ("ferrolm:num_requests_finished", "Requests finished, whatever the reason."),
    "errors": ("ferrolm:num_request_errors", "Requests that finished with an error."),
    "steps": ("ferrolm:num_steps", "Engine steps run."),
}
# core load figure -> (metric name, help)
_GAUGES = {
    "running": ("ferrolm:num_running_reqs", "Requests running."),
    "waiting": ("ferrolm:num_queue_reqs", "Requests waiting in the queue."),
    "kv_used": ("ferrolm:kv_used_tokens", "KV slots in use by requests and the cache."),
    "kv_capacity": ("ferrolm:kv_capacity_tokens", "KV slots in all."),
    "cached_tokens": ("ferrolm:cached_tokens", "Tokens held by the prefix cache."),
}


# KV event publisher counter -> (metric name without _total, help); only with --kv-events-config
_KV_EVENT_COUNTERS = {
    "kv_events_sent": ("ferrolm:kv_event_batches_published", "KV event batches sent on the PUB socket."),
    "kv_events_dropped": ("ferrolm:kv_event_batches_dropped",
                          "KV event batches dropped because the publisher's queue was full."),
    "kv_events_replays": ("ferrolm:kv_event_replays", "Replay requests answered."),
}


class _EngineStats(Collector):
    """The last snapshot of the core's counters and load."""

    def __init__(self) -> None:
        self.stats: dict[str, int] = {}
        self.model_name = ""

    def collect(self) -> Iterator[Metric]:
        for key, (name, doc) in _COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=self.stats.get(key, 0))
        for key, (name, doc) in _GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=self.stats.get(key, 0))
        capacity = self.stats.get("kv_capacity", 0)
        usage = self.stats.get("kv_used", 0) / capacity if capacity else 0.0
        yield GaugeMetricFamily("ferrolm:kv_cache_usage", "Fraction of the KV cache in use (0..1).", value=usage)
        prompt = self.stats.get("prompt_tokens", 0)
        hit_rate = self.stats.get("cache_hit_tokens", 0) / prompt if prompt else 0.0
        yield GaugeMetricFamily("ferrolm:cache_hit_rate", "Cache hit tokens over prompt tokens, since start.",
                                value=hit_rate)
        for key, (name, doc) in _KV_EVENT_COUNTERS.items():
            if key in self.stats:
                yield CounterMetricFamily(name, doc, value=self.stats[key])
        yield from self._vllm_metrics()

    def _vllm_metrics(self) -> Iterator[Metric]:
        """vLLM's names for the same figures (its v1 engine's)."""
        labels = ["model_name", "engine"]
        values = [self.model_name, "0"]

        def gauge(name: str, doc: str, value: float) -> Metric:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> Metric:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        s = self.stats
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.get("running", 0))
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.get("waiting", 0))
        # as vLLM counts it: cached blocks no request uses are free (evictable on demand)
        capacity = s.get("kv_capacity", 0)
        busy = s.get("kv_used", 0) - s.get("evictable_tokens", 0)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    busy / capacity if capacity else 0.0)
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      s.get("prompt_tokens", 0))
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      s.get("cache_hit_tokens", 0))


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.engine_stats = _EngineStats()
        self.registry.register(self.engine_stats)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, buckets=_LATENCY_BUCKETS, registry=self.registry)

        # core latency sample name -> histogram
        self.histograms = {
            "ttft_s": histogram("ferrolm:time_to_first_token_seconds", "Time to first token."),
            "itl_s": histogram("ferrolm:inter_token_latency_seconds", "Time between consecutive tokens."),
            "e2e_s": histogram("ferrolm:e2e_request_latency_seconds", "Time from arrival to finish."),
            "queue_s": histogram("ferrolm:queue_time_seconds", "Time waiting before the first prefill."),
            "grammar_s": histogram(
                "ferrolm:grammar_compile_seconds",
                "Time a structured-output request waited for its grammar (a compile, or a cache hit).",
            ),
        }

    def update(self, snapshot: dict[str, Any]) -> None:
        self.engine_stats.stats = dict(snapshot["stats"])
        for key, samples in snapshot["latencies"].items():
            histogram = self.histograms.get(key)
            if histogram is not None:
                for value in samples:
                    histogram.observe(value)


async def metrics(request: Request) -> Response:
    state = state_of(request)
    server_metrics: ServerMetrics = request.app.state.metrics
    server_metrics.engine_stats.model_name = state.args.model_name
    if state.client.ready:
        try:
            server_metrics.update(await state.client.call("metrics"))
        except EngineUnavailable:
            pass  # the last snapshot stands; /health tells the engine is gone
    return Response(generate_latest(server_metrics.registry), media_type=CONTENT_TYPE_LATEST)
