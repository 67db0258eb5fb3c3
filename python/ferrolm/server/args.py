"""``ServerArgs``: the settings of ``ferrolm serve``, with the flag names users know from
SGLang, and the argparse wiring that fills them."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ferrolm import _core
from ferrolm._core import REASONING_PARSERS as REASONING_CHOICES
from ferrolm._core import TOOL_CALL_PARSERS as PARSER_CHOICES
from ferrolm.errors import InvalidInputError
from ferrolm.kv_events_config import KvEventsConfig, parse_kv_events_config

SCHEDULE_POLICIES = ("fcfs", "lpm", "priority")
# as ferrolm.radix_py.POLICIES has them (SGLang's flag name; slru and tlru beside its six)
EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
# as ferrolm.model.runner_choice has them (not imported: that would load the model package here)
RUNNERS = ("auto", "numpy", "torch", "quant")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bfloat16", "float16", "float32")
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "q8_0")
QUANTIZATIONS = ("q8_0", "q4_k")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
API_KEY_ENV = "FERROLM_API_KEY"
# 8 MiB: room for the longest prompt a large context takes (128k tokens sent as JSON ids,
# up to 7 bytes each with the separator, are under 1 MiB; as text, ~4 bytes a token) many
# times over; it also bounds the memory and parse time one body can take from the HTTP
# threads.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
# the engine's defaults, defined once in the core (EngineConfig)
ENGINE_DEFAULTS = _core.EngineConfig.defaults()

if TYPE_CHECKING:
    from ferrolm.engine import Engine


@dataclass(slots=True)
class ServerArgs:
    model: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    served_model_name: str | None = None
    max_running_requests: int = ENGINE_DEFAULTS.max_running_requests
    schedule_policy: str = ENGINE_DEFAULTS.schedule_policy
    chunked_prefill_size: int = ENGINE_DEFAULTS.max_prefill_tokens
    max_total_tokens: int = ENGINE_DEFAULTS.kv_capacity
    disable_radix_cache: bool = not ENGINE_DEFAULTS.enable_prefix_cache
    radix_eviction_policy: str = (
        ENGINE_DEFAULTS.eviction_policy
    )  # which cached prefix goes first when the KV pool is short
    max_queued_requests: int | None = None  # beyond running + this many waiting: 429
    queue_timeout: float | None = None  # seconds a request may wait before its first step: then 503
    engine_heartbeat_timeout: float = 60.0  # seconds without word from the engine: 503 until it answers; 0: off
    seed: int = ENGINE_DEFAULTS.seed
    blas_threads: int | None = None
    runner: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"  # numpy runner: float16 (read in place by the core's kernel); torch: its dtype
    quantization: str | None = None  # q8_0 | q4_k: a float checkpoint on the quant runner, quantized at load
    mem_fraction_static: float | None = None  # torch on CUDA: KV pool from memory, not max_total_tokens
    device_sampling: bool | None = None  # the runner draws tokens on its device; None: where it is not the CPU
    device_greedy: bool | None = None  # the runner picks plain greedy tokens on its device; None: as above
    log_level: str = "info"
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies: 413
    tool_call_parser: str = "auto"  # a format of ferrolm.tools.formats; auto: from the chat template
    reasoning_parser: str = "auto"  # qwen3 | deepseek_r1: reasoning_content apart; auto: the chat template's
    disable_tool_call_constraint: bool = False  # parse calls only: no grammar from the tools
    # KV cache events for cache-aware routers, vLLM's --kv-events-config (None: off)
    kv_events_config: KvEventsConfig | None = None
    page_size: int = ENGINE_DEFAULTS.kv_event_block_size  # tokens per KV event block: a router's must equal it
    record_trace: str | None = None  # a file recording the engine's calls, for ferrolm replay
    # speculative decoding by lookup for requests that do not say otherwise: "off" | "ngram"
    speculative: str = "ngram" if ENGINE_DEFAULTS.speculative else "off"
    speculative_max_draft: int = ENGINE_DEFAULTS.speculative_max_draft
    speculative_row_cost: float | None = None  # a verified row's share of a step; None: by device
    # LoRA adapters: served beside the base model (vLLM's and SGLang's flags)
    enable_lora: bool = False
    lora_modules: list[str] | None = None  # name=path entries loaded at start (turns LoRA on)
    max_loras: int = ENGINE_DEFAULTS.max_loras  # adapters one step mixes at most
    max_cpu_loras: int | None = None  # adapters kept in memory (default max_loras)

    @property
    def model_name(self) -> str:
        """The id clients send as ``model`` and ``/v1/models`` lists."""
        return self.served_model_name or self.model

    def public_dict(self) -> dict[str, Any]:
        """The settings as ``/server_info`` shows them: the API key never leaves."""
        settings = asdict(self)
        settings["api_key"] = "set" if self.api_key else None
        return settings


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ServerArgs()
    parser.add_argument(
        "--model",
        "--model-path",
        dest="model",
        default=defaults.model,
        help="'tiny' (embedded) or a Hugging Face model folder",
    )
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (not on /health, /metrics); better: set {API_KEY_ENV}, "
        "which does not show in ps (the flag wins when both are given)",
    )
    parser.add_argument("--served-model-name", default=None, help="the model id clients use (default: --model)")
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=defaults.max_running_requests,
        help="requests in a batch at most (default %(default)s)",
    )
    parser.add_argument(
        "--schedule-policy",
        choices=SCHEDULE_POLICIES,
        default=defaults.schedule_policy,
        help="which waiting request goes first (default %(default)s)",
    )
    parser.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=defaults.chunked_prefill_size,
        help="prompt tokens prefilled per step (default %(default)s)",
    )
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help=f"KV cache capacity in tokens (default {defaults.max_total_tokens}, or from --mem-fraction-static)",
    )
    parser.add_argument("--disable-radix-cache", action="store_true", help="no prefix caching")
    parser.add_argument(
        "--radix-eviction-policy",
        choices=EVICTION_POLICIES,
        default=defaults.radix_eviction_policy,
        help="which cached prefix is evicted first: lru, lfu, fifo, mru, filo, priority (the "
        "request's), slru (segmented LRU: prefixes hit twice are kept longer), tlru (LRU "
        "where prefixes unused for 5 minutes go first)",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="requests allowed to wait beyond the running ones; more are refused with 429",
    )
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        help="seconds a request may wait in the queue; longer is answered with 503",
    )
    parser.add_argument(
        "--engine-heartbeat-timeout",
        type=_heartbeat_timeout,
        default=defaults.engine_heartbeat_timeout,
        help="seconds without word from the engine loop (it reports between steps, at least "
        "every 0.5 s) before it counts as frozen: /health and requests get 503 until it "
        "answers again; well above the longest step; 0 turns the watch off",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="the engine's RNG seed for unseeded requests (default %(default)s)",
    )
    parser.add_argument("--blas-threads", type=int, default=None, help="numpy BLAS threads (default: half the cores)")
    add_runner_arguments(parser)
    parser.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="torch runner on CUDA: size the KV pool so that weights and pool take this "
        "fraction of the GPU's memory (e.g. 0.85), instead of --max-total-tokens",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=defaults.log_level)
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=defaults.max_request_bytes,
        help="largest request body accepted; larger ones are refused with 413 (default 8 MiB)",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=PARSER_CHOICES,
        default=defaults.tool_call_parser,
        help="how the model writes tool calls: hermes (Qwen 2.5/3), llama3_json, mistral; auto: "
        "the format the chat template shows, if exactly one",
    )
    parser.add_argument(
        "--reasoning-parser",
        choices=REASONING_CHOICES,
        default=defaults.reasoning_parser,
        help="split <think>...</think> into reasoning_content (qwen3, deepseek_r1); structured "
        "output and tool calls are then constrained after the thinking; auto (default): the "
        "format the chat template shows (one that writes </think>), none: off",
    )
    parser.add_argument(
        "--record-trace",
        metavar="PATH",
        default=None,
        help="record every call to the engine core (arrivals, sampling settings, each step's plan "
        "and tokens) in PATH as JSON lines, to replay offline without the model: "
        "ferrolm replay PATH (or the ferrolm-replay binary)",
    )
    parser.add_argument(
        "--disable-tool-call-constraint",
        action="store_true",
        help="generate tool calls freely and only parse them (by default the calls are generated "
        "under a grammar built from the functions' schemas, so they always parse)",
    )
    parser.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="publish KV cache events for cache-aware routers (Dynamo, llm-d), as vLLM does: "
        "a JSON object with vLLM's fields, e.g. '{\"enable_kv_cache_events\": true, "
        '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", '
        '"topic": "kv-events"}\'',
    )
    parser.add_argument(
        "--enable-lora",
        action="store_true",
        help="serve LoRA adapters (PEFT folders) beside the base model: a request names one as its "
        "'model' (or SGLang's 'lora_path'); POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
        "change the set while serving",
    )
    parser.add_argument(
        "--lora-modules",
        nargs="+",
        default=None,
        metavar="NAME=PATH",
        help='adapters to load at start, as name=path (or vLLM\'s JSON {"name": ..., "path": ...}); '
        "turns --enable-lora on",
    )
    parser.add_argument(
        "--max-loras",
        type=int,
        default=defaults.max_loras,
        help="LoRA adapters one batch mixes at most; a request for one more waits (default %(default)s)",
    )
    parser.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        help="LoRA adapters whose weights stay in memory; the least recently used idle one is "
        "dropped for another and read again when asked for (default: --max-loras)",
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=defaults.page_size,
        help="tokens per block in the KV events (a router's block size must be the same; "
        f"default {defaults.page_size}, vLLM's)",
    )


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """``--runner``, ``--device``, ``--dtype``, ``--kv-cache-dtype``, ``--speculative*``:
    for ``serve`` and ``generate``."""
    parser.add_argument(
        "--runner",
        choices=RUNNERS,
        default="auto",
        help="model runner: numpy (float32, CPU), torch (CPU or CUDA, any dtype; needs "
        "pip install 'ferrolm[torch]') or quant (a GGUF's weights as stored, or a float "
        "checkpoint with --quantization or a half --dtype; the forward in the Rust core, on "
        "the CPU); auto: on the CPU quant for a GGUF, --quantization or a half --dtype, else "
        "numpy; torch where CUDA is present",
    )
    parser.add_argument(
        "--device", choices=DEVICES, default="auto", help="where the torch runner runs; auto: cuda if present, else cpu"
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the weights' type: on the CPU, float16/bfloat16 keep a float checkpoint's matrices "
        "in 2 bytes a weight on the quant runner (with --runner torch: torch's weights and "
        "activations); on CUDA the torch runner's weights, activations and KV cache; auto: "
        "the checkpoint's dtype on CUDA, float32 on the CPU",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="the KV pool's element type (attention computes in float32); auto: float16 on the "
        "numpy and quant runners (half the bytes its attention kernel reads), the --dtype on torch; "
        "q8_0 (the quant runner): ggml's 8-bit blocks, 34 bytes per 32 values",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="run a float checkpoint on the quant runner, its matrices quantized at load (q4_k: rows "
        "that are not whole 256-blocks fall back to q8_0; the embedding and head are q8_0)",
    )
    parser.add_argument(
        "--device-sampling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the runner draws every token on its device (penalties, bias, grammar masks, seeds "
        "and logprobs included; only ids and logprobs reach the host); default: on where "
        "the runner's device is not the CPU and the runner can (the torch runner)",
    )
    parser.add_argument(
        "--device-greedy",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the runner picks the tokens of steps whose requests are all plain greedy on its "
        "device; default: as --device-sampling",
    )
    parser.add_argument(
        "--speculative",
        choices=("off", "ngram"),
        default=ServerArgs().speculative,
        help="ngram: speculative decoding without a draft model for requests that do not set "
        "'speculative': each step drafts the tokens that followed the text's latest suffix earlier in "
        "its prompt or output, and one forward verifies them (the same tokens as without; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--speculative-max-draft",
        type=int,
        default=ServerArgs().speculative_max_draft,
        help="draft tokens verified per request and step at most (default %(default)s)",
    )
    parser.add_argument(
        "--speculative-row-cost",
        type=float,
        default=None,
        help="what a verified draft row costs as a share of a one-token step; drafts are as long as "
        f"their tokens are likely to pay for it (default: {ENGINE_DEFAULTS.speculative_row_cost} on the CPU, "
        "a twentieth of that on a GPU)",
    )


def kv_events_on(args: ServerArgs) -> bool:
    return args.kv_events_config is not None and args.kv_events_config.publishes


def build_engine(args: ServerArgs) -> Engine:
    """The engine ``args`` describe: the one mapping of the settings onto ``Engine``'s
    arguments (``ferrolm serve`` and ``ferrolm generate``)."""
    from ferrolm.engine import Engine, default_blas_threads

    return Engine(
        args.model,
        kv_capacity=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        max_prefill_tokens=args.chunked_prefill_size,
        schedule_policy=args.schedule_policy,
        enable_prefix_cache=not args.disable_radix_cache,
        eviction_policy=args.radix_eviction_policy,
        seed=args.seed,
        blas_threads=args.blas_threads or default_blas_threads(),
        runner=args.runner,
        device=args.device,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization,
        mem_fraction_static=args.mem_fraction_static,
        device_sampling=args.device_sampling,
        device_greedy=args.device_greedy,
        enable_kv_events=kv_events_on(args),
        kv_event_block_size=args.page_size,
        speculative=args.speculative == "ngram",
        speculative_max_draft=args.speculative_max_draft,
        speculative_row_cost=args.speculative_row_cost,
        enable_lora=args.enable_lora,
        lora_modules=args.lora_modules,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        record_trace=args.record_trace,
    )


def _heartbeat_timeout(text: str) -> float:
    value = float(text)
    if value != 0 and not value >= 1:
        raise argparse.ArgumentTypeError(f"{text}: give 0 (off) or at least 1 second (the engine reports every 0.5 s)")
    return value


def server_args_from(ns: argparse.Namespace, environ: dict[str, str] | None = None) -> ServerArgs:
    """The settings from the parsed flags; the API key from ``--api-key``, else from the
    environment. An empty key is an error, not "no key": a key that went missing on its way
    (an unset variable in a script) must not open the server."""
    environ = dict(os.environ) if environ is None else environ
    settings = {name: getattr(ns, name) for name in ServerArgs.__dataclass_fields__}
    if settings["api_key"] is None:
        settings["api_key"] = environ.get(API_KEY_ENV)
        if settings["api_key"] is not None and not settings["api_key"].strip():
            raise SystemExit(f"ferrolm serve: {API_KEY_ENV} is set but empty; unset it to serve without a key")
    elif not settings["api_key"].strip():
        raise SystemExit("ferrolm serve: --api-key is empty")
    if settings["max_total_tokens"] is None:
        settings["max_total_tokens"] = ServerArgs().max_total_tokens
    elif settings["mem_fraction_static"] is not None:
        raise SystemExit("ferrolm serve: give --max-total-tokens or --mem-fraction-static, not both")
    if settings["max_request_bytes"] < 1:
        raise SystemExit("ferrolm serve: --max-request-bytes must be positive")
    if settings["max_loras"] < 1 or (settings["max_cpu_loras"] is not None and settings["max_cpu_loras"] < 1):
        raise SystemExit("ferrolm serve: --max-loras and --max-cpu-loras must be at least 1")
    if not 1 <= settings["page_size"] <= 1 << 20:
        raise SystemExit("ferrolm serve: --page-size must be in 1..1048576")
    if settings["kv_events_config"] is not None:
        try:
            settings["kv_events_config"] = parse_kv_events_config(settings["kv_events_config"])
        except InvalidInputError as e:
            raise SystemExit(f"ferrolm serve: --kv-events-config: {e}") from None
    return ServerArgs(**settings)
