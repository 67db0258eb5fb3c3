//! `GET /metrics`: Prometheus text with the `ferrolm:` names (and vLLM's). The core
//! keeps the counters and latency samples; each scrape takes them once (between steps),
//! feeds the new samples into the histograms here and reports counters and gauges as the
//! core has them.

use std::fmt::Write;
use std::sync::Mutex;

use ferrolm_core::engine::{EngineStats, LatencySamples, Load};

use crate::kv_events::KvEventCounts;

const BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// A step's forward takes well under a millisecond on a small model: finer at the bottom.
const FORWARD_BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::with_bounds(&BUCKETS)
    }
}

impl Histogram {
    pub fn with_bounds(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], count: 0, sum: 0.0 }
    }

    pub fn observe(&mut self, v: f64) {
        for (i, &b) in self.bounds.iter().enumerate() {
            if v <= b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }

    fn write(&self, out: &mut String, name: &str, help: &str, created: f64) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, &b) in self.bounds.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\"}} {}",
                prom_float(b),
                prom_float(self.counts[i] as f64)
            );
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", prom_float(self.count as f64));
        let _ = writeln!(out, "{name}_count {}", prom_float(self.count as f64));
        let _ = writeln!(out, "{name}_sum {}", prom_float(self.sum));
        // as prometheus_client writes it for a histogram: when the series started
        let _ = writeln!(
            out,
            "# HELP {name}_created {help}\n# TYPE {name}_created gauge\n{name}_created {}",
            prom_float(created)
        );
    }
}

/// The step loop's own timing of its forward calls (`frontend.commit(..., forward_s,
/// forward_cpu_s)`): each step's forward wall time as a histogram, and the loop thread's
/// CPU time inside the forward as a counter, so that a reader can split the loop
/// thread's CPU into forward and the rest (what `ferrolm bench serve` reports).
#[derive(Debug)]
pub struct ForwardTimes {
    inner: Mutex<(Histogram, f64)>,
}

impl Default for ForwardTimes {
    fn default() -> Self {
        ForwardTimes { inner: Mutex::new((Histogram::with_bounds(&FORWARD_BUCKETS), 0.0)) }
    }
}

impl ForwardTimes {
    pub fn note(&self, seconds: f64, cpu_seconds: f64) {
        let mut inner = self.inner.lock().unwrap();
        inner.0.observe(seconds.max(0.0));
        inner.1 += cpu_seconds.max(0.0);
    }

    fn write(&self, out: &mut String, created: f64) {
        let (histogram, cpu) = self.inner.lock().unwrap().clone();
        histogram.write(
            out,
            "ferrolm:forward_seconds",
            "Wall time of each step's model forward (sampling on the device included), as the step loop times it.",
            created,
        );
        let _ = writeln!(
            out,
            "# HELP ferrolm:forward_loop_cpu_seconds_total CPU time of the step loop's thread inside the \
             model forward.\n# TYPE ferrolm:forward_loop_cpu_seconds_total counter\n\
             ferrolm:forward_loop_cpu_seconds_total {}",
            prom_float(cpu)
        );
    }
}

/// Prometheus counters (`name_total`), each with its HELP and TYPE lines.
fn write_counters(out: &mut String, counters: &[(&str, &str, u64)]) {
    for &(name, help, v) in counters {
        let _ = writeln!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total {}",
            prom_float(v as f64)
        );
    }
}

/// Drafts by tokens kept (speculative decoding), as a histogram whose buckets are the
/// kept counts: `le="k"` counts the drafts that kept at most k tokens.
fn write_acceptance(out: &mut String, by_kept: &[u64]) {
    let name = "ferrolm:spec_decode_accepted_tokens_per_draft";
    let _ = writeln!(out, "# HELP {name} Draft tokens kept per verified draft.\n# TYPE {name} histogram");
    let (mut count, mut sum) = (0u64, 0u64);
    for (k, &n) in by_kept.iter().enumerate() {
        count += n;
        sum += k as u64 * n;
        if k + 1 < by_kept.len() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{k}.0\"}} {count}");
        }
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}.0\n{name}_count {count}");
}

fn prom_float(x: f64) -> String {
    let s = format!("{x}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

#[derive(Clone, Debug, Default)]
pub struct Histograms {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    grammar: Histogram,
    stats: EngineStats,
    load: Option<Load>,
    /// Unix time the histograms started.
    pub created: f64,
}

impl Histograms {
    /// Empty histograms that started at `created` (Unix seconds).
    pub fn new(created: f64) -> Self {
        Histograms { created, ..Default::default() }
    }

    pub fn update(&mut self, stats: EngineStats, load: Load, l: LatencySamples) {
        self.stats = stats;
        self.load = Some(load);
        for (h, samples) in [
            (&mut self.ttft, &l.ttft_s),
            (&mut self.itl, &l.itl_s),
            (&mut self.e2e, &l.e2e_s),
            (&mut self.queue, &l.queue_s),
        ] {
            for &v in samples {
                h.observe(v);
            }
        }
    }

    /// Seconds a structured-output request waited for its grammar.
    pub fn observe_grammar(&mut self, seconds: f64) {
        self.grammar.observe(seconds);
    }

    /// The text of a scrape; `model_name` labels the `vllm:` and `sglang:` series,
    /// `block_size` is the KV page (`vllm:cache_config_info`), `kv_events` are the KV
    /// event publisher's counters (`None`: events are off, no series), `forward` the step
    /// loop's forward timings.
    pub fn render(
        &self,
        model_name: &str,
        block_size: u64,
        kv_events: Option<KvEventCounts>,
        forward: &ForwardTimes,
        loras: bool,
    ) -> String {
        let mut out = String::new();
        let s = &self.stats;
        let counters: [(&str, &str, u64); 7] = [
            ("ferrolm:prompt_tokens", "Prompt tokens of admitted requests.", s.prompt_tokens),
            ("ferrolm:generation_tokens", "Generated tokens.", s.generation_tokens),
            ("ferrolm:cache_hit_tokens", "Prompt tokens found in the prefix cache.", s.cache_hit_tokens),
            (
                "ferrolm:num_retractions",
                "Running requests retracted (preempted) under KV pressure.",
                s.retractions,
            ),
            ("ferrolm:num_requests_finished", "Requests finished, whatever the reason.", s.finished),
            ("ferrolm:num_request_errors", "Requests that finished with an error.", s.errors),
            ("ferrolm:num_steps", "Engine steps run.", s.steps),
        ];
        write_counters(&mut out, &counters);
        let l = self.load.clone().unwrap_or_default();
        let gauges: [(&str, &str, f64); 7] = [
            ("ferrolm:num_running_reqs", "Requests running.", l.running as f64),
            ("ferrolm:num_queue_reqs", "Requests waiting in the queue.", l.waiting as f64),
            ("ferrolm:kv_used_tokens", "KV slots in use by requests and the cache.", l.kv_used as f64),
            ("ferrolm:kv_capacity_tokens", "KV slots in all.", l.kv_capacity as f64),
            ("ferrolm:cached_tokens", "Tokens held by the prefix cache.", l.cached_tokens as f64),
            (
                "ferrolm:kv_cache_usage",
                "Fraction of the KV cache in use (0..1).",
                if l.kv_capacity > 0 { l.kv_used as f64 / l.kv_capacity as f64 } else { 0.0 },
            ),
            (
                "ferrolm:cache_hit_rate",
                "Cache hit tokens over prompt tokens, since start.",
                if s.prompt_tokens > 0 { s.cache_hit_tokens as f64 / s.prompt_tokens as f64 } else { 0.0 },
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}", prom_float(v));
        }
        let _ = writeln!(
            out,
            "# HELP ferrolm:sampling_thread_cpu_seconds_total CPU time of the threads that sample a large \
             step beside the step loop's.\n# TYPE ferrolm:sampling_thread_cpu_seconds_total counter\n\
             ferrolm:sampling_thread_cpu_seconds_total {}",
            prom_float(s.sampling_thread_cpu_ns as f64 / 1e9)
        );
        write_acceptance(&mut out, &s.spec_accepted_histogram);
        if let Some(kv) = kv_events {
            let counters: [(&str, &str, u64); 3] = [
                ("ferrolm:kv_event_batches_published", "KV event batches sent on the PUB socket.", kv.sent),
                (
                    "ferrolm:kv_event_batches_dropped",
                    "KV event batches dropped because the publisher's queue was full.",
                    kv.dropped,
                ),
                ("ferrolm:kv_event_replays", "Replay requests answered.", kv.replays),
            ];
            write_counters(&mut out, &counters);
        }
        self.write_vllm(&mut out, model_name, block_size, &l);
        if loras {
            write_lora_info(&mut out, &l, self.created);
        }
        self.write_sglang(&mut out, model_name, &l);
        self.ttft.write(
            &mut out,
            "ferrolm:time_to_first_token_seconds",
            "Time to first token.",
            self.created,
        );
        self.itl.write(
            &mut out,
            "ferrolm:inter_token_latency_seconds",
            "Time between consecutive tokens.",
            self.created,
        );
        self.e2e.write(
            &mut out,
            "ferrolm:e2e_request_latency_seconds",
            "Time from arrival to finish.",
            self.created,
        );
        self.queue.write(
            &mut out,
            "ferrolm:queue_time_seconds",
            "Time waiting before the first prefill.",
            self.created,
        );
        self.grammar.write(
            &mut out,
            "ferrolm:grammar_compile_seconds",
            "Time a structured-output request waited for its grammar (a compile, or a cache hit).",
            self.created,
        );
        forward.write(&mut out, self.created);
        out
    }
}

/// vLLM's `vllm:lora_requests_info` (written where LoRA is on): the adapters of running
/// and of waiting requests as comma-separated label values, and the most a step mixes;
/// routers that place requests by adapter (llm-d, the inference gateway) read it. Its
/// value is a time, as vLLM's: the scrape's, once requests have run, else the start's.
fn write_lora_info(out: &mut String, l: &Load, created: f64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(created, |d| d.as_secs_f64());
    let names = |v: &[String]| label_value(&v.join(","));
    let _ = writeln!(
        out,
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}",
        l.max_loras,
        names(&l.running_loras),
        names(&l.waiting_loras),
        prom_float(now)
    );
}

impl Histograms {
    /// vLLM's names for the load and prefix-cache figures (its v1 engine's, and the older
    /// names that routers written against vLLM 0.x still read), labelled with `model_name`
    /// and `engine`, as cache-aware routers scrape them from vLLM replicas; and
    /// `vllm:cache_config_info`, whose labels carry the KV block size.
    fn write_vllm(&self, out: &mut String, model_name: &str, block_size: u64, l: &Load) {
        let s = &self.stats;
        let model = label_value(model_name);
        let labels = format!("{{engine=\"0\",model_name=\"{model}\"}}");
        // as vLLM counts it: cached blocks no request uses are free (evictable on demand)
        let busy = l.kv_used.saturating_sub(l.evictable_tokens) as f64;
        let usage = if l.kv_capacity > 0 { busy / l.kv_capacity as f64 } else { 0.0 };
        let series: [(&str, &str, &str, f64); 12] = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                l.running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                l.waiting as f64,
            ),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage),
            (
                "vllm:gpu_cache_usage_perc",
                "gauge",
                "KV-cache usage (vLLM 0.x name). 1 means 100 percent usage.",
                usage,
            ),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                s.prompt_tokens as f64,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                s.cache_hit_tokens as f64,
            ),
            (
                "vllm:gpu_prefix_cache_queries_total",
                "counter",
                "Prefix cache queries in tokens (vLLM 0.x name).",
                s.prompt_tokens as f64,
            ),
            (
                "vllm:gpu_prefix_cache_hits_total",
                "counter",
                "Prefix cache hits in tokens (vLLM 0.x name).",
                s.cache_hit_tokens as f64,
            ),
            (
                "vllm:num_preemptions_total",
                "counter",
                "Cumulative number of preemptions.",
                s.retractions as f64,
            ),
            (
                "vllm:spec_decode_num_drafts_total",
                "counter",
                "Number of spec decoding drafts.",
                s.spec_drafts as f64,
            ),
            (
                "vllm:spec_decode_num_draft_tokens_total",
                "counter",
                "Number of draft tokens.",
                s.spec_draft_tokens as f64,
            ),
            (
                "vllm:spec_decode_num_accepted_tokens_total",
                "counter",
                "Number of accepted tokens.",
                s.spec_accepted_tokens as f64,
            ),
        ];
        write_series(out, &labels, &series);
        let blocks = (l.kv_capacity as u64).checked_div(block_size).unwrap_or(0);
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the KV cache config.\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{block_size}\",enable_prefix_caching=\"True\",\
             engine=\"0\",num_gpu_blocks=\"{blocks}\"}} 1.0"
        );
    }

    /// SGLang's names for the load and cache gauges (its scheduler's), labelled with
    /// `model_name`, as the SGLang Model Gateway and dashboards written for SGLang read them.
    fn write_sglang(&self, out: &mut String, model_name: &str, l: &Load) {
        let s = &self.stats;
        let labels = format!("{{model_name=\"{}\"}}", label_value(model_name));
        let used = l.kv_used.saturating_sub(l.evictable_tokens);
        let series: [(&str, &str, &str, f64); 8] = [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", l.running as f64),
            (
                "sglang:num_queue_reqs",
                "gauge",
                "The number of requests in the waiting queue.",
                l.waiting as f64,
            ),
            ("sglang:num_used_tokens", "gauge", "The number of used tokens.", used as f64),
            (
                "sglang:token_usage",
                "gauge",
                "The token usage.",
                if l.kv_capacity > 0 { used as f64 / l.kv_capacity as f64 } else { 0.0 },
            ),
            ("sglang:max_total_num_tokens", "gauge", "KV slots in all.", l.kv_capacity as f64),
            (
                "sglang:cache_hit_rate",
                "gauge",
                "The prefix cache hit rate.",
                if s.prompt_tokens > 0 { s.cache_hit_tokens as f64 / s.prompt_tokens as f64 } else { 0.0 },
            ),
            (
                "sglang:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                s.prompt_tokens as f64,
            ),
            (
                "sglang:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                s.generation_tokens as f64,
            ),
        ];
        write_series(out, &labels, &series);
    }
}

/// One sample per `(name, type, help, value)`, each under the same labels (the other
/// servers' names: vLLM's, SGLang's).
fn write_series(out: &mut String, labels: &str, series: &[(&str, &str, &str, f64)]) {
    for (name, kind, help, v) in series {
        let _ =
            writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {}", prom_float(*v));
    }
}

/// A label value as Prometheus' text format escapes it.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe(0.003);
        h.observe(0.2);
        h.observe(500.0);
        let mut out = String::new();
        h.write(&mut out, "x", "help", 0.0);
        assert!(out.contains("x_bucket{le=\"0.001\"} 0.0\n"));
        assert!(out.contains("x_bucket{le=\"0.005\"} 1.0\n"));
        assert!(out.contains("x_bucket{le=\"0.25\"} 2.0\n"));
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3.0\n"));
        assert!(out.contains("x_count 3.0\n"));
    }

    #[test]
    fn vllm_series_carry_the_model_and_kv_event_counters_only_when_on() {
        let h = Histograms::new(0.0);
        let forward = ForwardTimes::default();
        let text = h.render("a\"b", 16, None, &forward, false);
        assert!(
            text.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"a\\\"b\"} 0.0\n"),
            "{text}"
        );
        assert!(text.contains("vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"a\\\"b\"} 0.0\n"));
        assert!(!text.contains("kv_event"));
        for old_and_new in
            ["vllm:gpu_cache_usage_perc{", "vllm:kv_cache_usage_perc{", "vllm:gpu_prefix_cache_hits_total{"]
        {
            assert!(text.contains(old_and_new), "{old_and_new}: {text}");
        }
        assert!(text.contains("vllm:cache_config_info{block_size=\"16\","), "{text}");
        assert!(text.contains("sglang:num_queue_reqs{model_name=\"a\\\"b\"} 0.0\n"), "{text}");
        let kv = KvEventCounts { queued: 4, sent: 3, dropped: 0, replays: 2, late: 0 };
        let text = h.render("tiny", 16, Some(kv), &forward, false);
        assert!(text.contains("ferrolm:kv_event_batches_published_total 3.0\n"));
        assert!(text.contains("ferrolm:kv_event_replays_total 2.0\n"));
    }

    #[test]
    fn forward_times_show_as_a_histogram_and_the_loops_cpu_counter() {
        let forward = ForwardTimes::default();
        forward.note(0.25, 0.125);
        forward.note(0.5, 0.25);
        let text = Histograms::new(0.0).render("tiny", 16, None, &forward, false);
        assert!(text.contains("# TYPE ferrolm:forward_seconds histogram\n"), "{text}");
        assert!(text.contains("ferrolm:forward_seconds_bucket{le=\"0.1\"} 0.0\n"), "{text}");
        assert!(text.contains("ferrolm:forward_seconds_bucket{le=\"0.25\"} 1.0\n"), "{text}");
        assert!(text.contains("ferrolm:forward_seconds_bucket{le=\"+Inf\"} 2.0\n"));
        assert!(text.contains("ferrolm:forward_seconds_count 2.0\n"));
        assert!(text.contains("ferrolm:forward_seconds_sum 0.75\n"), "{text}");
        assert!(text.contains("ferrolm:forward_loop_cpu_seconds_total 0.375\n"), "{text}");
    }
}
