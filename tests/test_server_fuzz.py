"""Fuzzing the HTTP API: hypothesis builds request bodies for every route from a catalog of
the request bodies' fields (``BODIES``: each field's type and bounds as the API documents
them; each value drawn from a mix of valid values, boundary numbers around the core's
integer widths, non-finite floats, wrong types, unknown fields) and sends them to a real
``ferrolm serve`` on a loopback port.

Whatever is sent: no 5xx; every error in OpenAI's envelope, its ``param`` the dotted path
of a field of that request; and afterwards the server still serves, with no request
running or waiting and no KV held beyond the prefix cache. Bounded: a fixed number of
examples (``FERROLM_FUZZ_EXAMPLES``, default 150), generations of a few tokens. The
examples are the same each run (a red CI run must be one that reproduces);
``FERROLM_FUZZ_RANDOM=1`` draws new ones, for fuzzing on purpose.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from ferrolm.server.testing import RunningServer, running_server, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("FERROLM_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("FERROLM_FUZZ_RANDOM", "") not in ("", "0")


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--max-total-tokens", "4096", "--max-request-bytes", str(1 << 20)) as s:
        yield s


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


# ---- the request bodies: each field's type and bounds ----

U32_MAX, U64_MAX, I64_MIN, I64_MAX = 2**32 - 1, 2**64 - 1, -(2**63), 2**63 - 1


@dataclass(frozen=True)
class F:
    """A field: ``kind`` is bool, int, float, str, a tuple of the strings it takes, or None
    (anything: only nasty values are drawn); ``lo``/``hi`` its bounds (``lo_open``: lo
    itself excluded); ``nested`` the bodies its value may be (or a list of); ``free``: a
    free-form object whose keys are the client's (a JSON Schema, ``logit_bias``)."""

    kind: Any = None
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    nested: tuple[str, ...] = ()
    free: bool = False


TOKEN_COUNT = F(int, 0, U64_MAX)
SCHEMA_FIELD = F(str, free=True)  # a JSON Schema as text or an object
PENALTY = F(float, -2.0, 2.0)
TOOL_CHOICE = F(("none", "auto", "required"), nested=("NamedToolChoice",))
OPENAI_SAMPLING: dict[str, F] = {
    "model": F(str),
    "n": F(int, 1, 128),
    "temperature": F(float, 0.0),
    "top_p": F(float, 0.0, 1.0, lo_open=True),
    "stop": F(),
    "seed": F(int, 0, U64_MAX),
    "logit_bias": F(free=True),
    "frequency_penalty": PENALTY,
    "presence_penalty": PENALTY,
    "stream": F(bool),
    "stream_options": F(nested=("StreamOptions",)),
    "max_tokens": F(int, 1, U64_MAX),
    "top_k": F(int, -1, U32_MAX),
    "min_p": F(float, 0.0, 1.0),
    "repetition_penalty": F(float, 0.0, lo_open=True),
    "ignore_eos": F(bool),
    "min_tokens": TOKEN_COUNT,
    "stop_token_ids": F(),
    "skip_special_tokens": F(bool),
    "include_stop_str_in_output": F(bool),
    "priority": F(int, I64_MIN, I64_MAX),
    "cache_salt": F(str),
    "response_format": F(nested=("ResponseFormat",)),
    "regex": F(str),
    "json_schema": SCHEMA_FIELD,
    "ebnf": F(str),
    "guided_json": SCHEMA_FIELD,
    "guided_regex": F(str),
    "guided_choice": F(),
    "guided_grammar": F(str),
    "grammar": F(str),
    "user": F(str),
    "cache_prompt": F(bool),
}
BODIES: dict[str, dict[str, F]] = {
    "StreamOptions": {"include_usage": F(bool)},
    "ResponseFormat": {"type": F(("text", "json_object", "json_schema")), "json_schema": F(free=True)},
    "CompletionRequest": {
        **OPENAI_SAMPLING,
        "prompt": F(),
        "logprobs": F(int, 0, 20),
        "echo": F(bool),
        "suffix": F(str),
        "best_of": F(int, 1, U32_MAX),
    },
    "TextPart": {"type": F(("text",)), "text": F(str)},
    "FunctionDefinition": {"name": F(str), "description": F(str), "parameters": F(free=True), "strict": F(bool)},
    "Tool": {"type": F(("function",)), "function": F(nested=("FunctionDefinition",))},
    "FunctionName": {"name": F(str)},
    "NamedToolChoice": {"type": F(("function",)), "function": F(nested=("FunctionName",))},
    "CalledFunction": {"name": F(str), "arguments": F(str, free=True)},
    "ToolCallMessagePart": {
        "id": F(str),
        "type": F(("function",)),
        "function": F(nested=("CalledFunction",)),
        "index": F(int),
    },
    "ChatMessage": {
        "role": F(("system", "developer", "user", "assistant", "tool")),
        "content": F(str, nested=("TextPart",)),
        "name": F(str),
        "tool_call_id": F(str),
        "tool_calls": F(nested=("ToolCallMessagePart",)),
        "refusal": F(str),
        "annotations": F(),
        "reasoning_content": F(str),
    },
    "ChatCompletionRequest": {
        **OPENAI_SAMPLING,
        "messages": F(nested=("ChatMessage",)),
        "max_completion_tokens": F(int, 1, U64_MAX),
        "logprobs": F(bool),
        "top_logprobs": F(int, 0, 20),
        "tools": F(nested=("Tool",)),
        "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": F(bool),
        "chat_template_kwargs": F(free=True),
        "safety_identifier": F(str),
        "store": F(bool),
        "metadata": F(free=True),
        "service_tier": F(str),
        "prompt_cache_key": F(str),
    },
    "NativeSamplingParams": {
        "max_new_tokens": F(int, 1, U64_MAX),
        "min_new_tokens": TOKEN_COUNT,
        "temperature": F(float, 0.0),
        "top_p": F(float, 0.0, 1.0, lo_open=True),
        "top_k": F(int, -1, U32_MAX),
        "min_p": F(float, 0.0, 1.0),
        "repetition_penalty": F(float, 0.0, lo_open=True),
        "frequency_penalty": PENALTY,
        "presence_penalty": PENALTY,
        "stop": F(),
        "stop_token_ids": F(),
        "ignore_eos": F(bool),
        "skip_special_tokens": F(bool),
        "no_stop_trim": F(bool),
        "seed": F(int, 0, U64_MAX),
        "n": F(int, 1, 128),
        "logit_bias": F(free=True),
        "regex": F(str),
        "json_schema": SCHEMA_FIELD,
        "ebnf": F(str),
    },
    "GenerateRequest": {
        "text": F(str),
        "input_ids": F(),
        "sampling_params": F(nested=("NativeSamplingParams",)),
        "stream": F(bool),
        "rid": F(str),
        "return_logprob": F(bool),
        "top_logprobs_num": F(int, 0, 20),
        "priority": F(int, I64_MIN, I64_MAX),
        "cache_salt": F(str),
        "tools": F(nested=("Tool",)),
        "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": F(bool),
        "separate_reasoning": F(bool),
    },
    "AbortRequest": {"rid": F(str), "abort_all": F(bool)},
    "FlushCacheRequest": {},
}

# ---- values ----

BOUNDARY_INTS = [
    0,
    1,
    -1,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64 - 1,
    2**64,
    10**30,
    -(10**30),
    10**400,
]
ODD_FLOATS = [0.0, -0.0, 1e-320, 0.5, 1.0, 2.0, 100.0, 3.4e38, 3.5e38, 1e308, -1e308, math.inf, -math.inf, math.nan]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(BOUNDARY_INTS),
    st.integers(),
    st.sampled_from(ODD_FLOATS),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["", " 5", "+5", "1_000", "\u0663", "5", "abc"]),
)
nasty = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)

# fields whose valid values set how long a generation runs: small valid values, or invalid
# ones (never null: a chat without a budget runs to the end of the context)
LENGTHS = st.one_of(
    st.integers(1, 6),
    st.sampled_from([0, -1, 2**32, 2**63, 2**64, 10**30, 4096, 5000]),
    st.sampled_from([True, "4", 4.0, [4]]),
)
COUNTS = st.one_of(st.integers(1, 3), st.sampled_from([0, -1, 129, 2**32, 2**64, True, "2"]))
TOKEN_IDS = st.one_of(st.integers(0, 40_000), st.sampled_from(BOUNDARY_INTS))
TEXT = st.one_of(st.text(max_size=30), st.sampled_from(["Hello", "", "\x00", "<|im_start|>", "\ud7ff\ue000"]))
# grammars from a fixed list: what compiles (or not) is the constraint engine's to fuzz,
# and a random regex can be arbitrarily costly to compile
GRAMMARS = st.sampled_from(
    [
        "[a-z]{1,3}",
        "((",
        "a|b",
        "",
        '{"type": "object"}',
        "{",
        {"type": "string"},
        {"type": "integer", "minimum": 3},
        {"type": 5},
        {},
        7,
        None,
        'root ::= "a" | "(" root ")"',
        "root ::= x",
    ]
)

SPECIAL: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": LENGTHS,
    "max_completion_tokens": LENGTHS,
    "max_new_tokens": LENGTHS,
    "min_tokens": LENGTHS,
    "min_new_tokens": LENGTHS,
    "n": COUNTS,
    "best_of": COUNTS,
    "prompt": st.one_of(
        TEXT,
        st.lists(TOKEN_IDS, max_size=5),
        st.lists(TEXT, max_size=3),
        st.lists(st.lists(TOKEN_IDS, max_size=4), max_size=3),
        nasty,
    ),
    "input_ids": st.one_of(st.lists(TOKEN_IDS, max_size=5), nasty),
    "text": st.one_of(TEXT, nasty),
    "stop_token_ids": st.one_of(st.lists(TOKEN_IDS, max_size=3), nasty),
    "logit_bias": st.one_of(
        st.dictionaries(
            st.one_of(st.integers(-5, 2**40).map(str), st.text(max_size=6)),
            st.one_of(st.floats(), st.integers(-200, 200)),
            max_size=3,
        ),
        nasty,
    ),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3), nasty),
    "regex": GRAMMARS,
    "json_schema": GRAMMARS,
    "ebnf": GRAMMARS,
    "guided_json": GRAMMARS,
    "guided_regex": GRAMMARS,
    "guided_grammar": GRAMMARS,
    "grammar": GRAMMARS,
    "guided_choice": st.one_of(st.lists(st.sampled_from(["yes", "no", "", "maybe so"]), max_size=3), GRAMMARS),
    "tools": st.one_of(st.just([]), st.just([{"type": "function"}]), nasty),
    "cache_salt": st.one_of(TEXT, st.text(min_size=500, max_size=600), nasty),
}
UNKNOWN = st.sampled_from(
    [
        "max_tokenz",
        "lora_id",
        "guided_grammars",
        "guided_decoding_backend",
        "function_call",
        "logprob_start_len",
        "image_data",
        "Temperature",
        "functions",
        "x" * 40,
    ]
)


def valid_for(f: F) -> st.SearchStrategy[Any] | None:
    """Values the field's own type and bounds allow (small ones), where simple to say."""
    if f.kind is bool:
        return st.booleans()
    if f.kind is int:
        lo = int(f.lo) if f.lo is not None else -10
        return st.integers(lo, min(int(f.hi) if f.hi is not None else lo + 20, lo + 20))
    if f.kind is float:
        lo = f.lo if f.lo is not None else -1.0
        return st.floats(lo, f.hi if f.hi is not None else lo + 3.0, exclude_min=f.lo_open)
    if f.kind is str:
        return TEXT
    if isinstance(f.kind, tuple):
        return st.sampled_from(f.kind)
    return None


def value_for(name: str, f: F, depth: int) -> st.SearchStrategy[Any]:
    if name in SPECIAL:
        return SPECIAL[name]
    valid = valid_for(f)
    options = [nasty] if valid is None else [valid, valid, valid, nasty]
    for model in f.nested:
        if depth < 2:
            one = body_of(model, {}, depth + 1)
            options += [one, one, st.lists(one, min_size=1, max_size=2)]
    return st.one_of(*options)


def body_of(model: str, base: dict[str, Any], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """``base`` with some of ``model``'s fields set (or removed), maybe an unknown one added."""
    fields = sorted(BODIES[model])

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        body = dict(base)
        for name in draw(st.lists(st.sampled_from(fields), max_size=4, unique=True)) if fields else []:
            body[name] = draw(value_for(name, BODIES[model][name], depth))
        if base and draw(st.integers(0, 9)) == 0:
            body.pop(draw(st.sampled_from(sorted(base))), None)
        if draw(st.integers(0, 7)) == 0:
            body[draw(UNKNOWN)] = draw(nasty)
        return body

    return build()


MSG = [{"role": "user", "content": "hi"}]
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("/v1/completions", "CompletionRequest", {"prompt": "Hello", "max_tokens": 4}),
    ("/v1/chat/completions", "ChatCompletionRequest", {"messages": MSG, "max_tokens": 4}),
    ("/generate", "GenerateRequest", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}),
    ("/abort_request", "AbortRequest", {"rid": "nothing-runs-by-this-name"}),
    ("/flush_cache", "FlushCacheRequest", {}),
]
MODELS_OF_ROUTE = {path: model for path, model, _ in ROUTES}
# the chat route's budget stays set: a chat without one runs to the end of the context
REQUIRED = {"/v1/chat/completions": "max_tokens"}

posts = st.one_of(*[st.tuples(st.just(path), body_of(model, base)) for path, model, base in ROUTES])
GET_PATHS = ["/v1/models", "/health", "/server_info", "/get_server_info", "/get_model_info", "/metrics"]
gets: st.SearchStrategy[tuple[str, dict[str, str]]] = st.one_of(
    st.tuples(st.sampled_from(GET_PATHS), st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2)),
    st.tuples(st.text(max_size=20).map(lambda s: "/v1/models/" + quote(s, safe="")), st.just({})),
)


def field_paths(model: str, prefix: str = "", depth: int = 0) -> dict[str, bool]:
    """Every dotted path of a field of ``model`` (list indices as ``N``), and whether the
    field is a free-form object (whose keys are the client's: ``json_schema.schema``)."""
    out: dict[str, bool] = {}
    for name, f in BODIES[model].items():
        out[prefix + name] = f.free
        for nested in f.nested:
            if depth < 2:
                out |= field_paths(nested, f"{prefix}{name}.", depth + 1)
                out |= field_paths(nested, f"{prefix}{name}.N.", depth + 1)
    return out


def names_a_field(param: str, model: str, body: dict[str, Any]) -> bool:
    """``param`` is a field of the model (or a member of one that is a free-form object),
    or a key the request sent (an unknown field), where numeric path parts are list
    indices."""
    parts = ["N" if part.isdigit() else part for part in param.split(".")]
    paths = field_paths(model)
    if ".".join(parts) in paths:
        return True
    if any(paths.get(".".join(parts[:i])) for i in range(1, len(parts))):
        return True
    return path_in(body, param)  # an unknown field: the path exists in what was sent


def path_in(node: Any, path: str) -> bool:
    """``path`` walks ``node``: keys joined by dots, where a key may itself hold dots (a
    sent key ``"."`` under ``cache_prompt`` is named ``cache_prompt..``)."""
    if isinstance(node, list):
        head, dot, rest = path.partition(".")
        if not head.isdigit() or int(head) >= len(node):
            return False
        return not dot or path_in(node[int(head)], rest)
    if isinstance(node, dict):
        return any(
            path == key or (path.startswith(key + ".") and path_in(node[key], path[len(key) + 1 :]))
            for key in node
            if isinstance(key, str)
        )
    return False


def check_error(r: httpx.Response, model: str | None, body: Any) -> None:
    assert r.status_code < 500, (r.status_code, r.text, body)
    if r.status_code < 400:
        return
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], r.text
    if error["param"] is not None and model is not None:
        assert isinstance(body, dict) and names_a_field(error["param"], model, body), (error, body)


def drain_stream(r: httpx.Response) -> None:
    """Every SSE event is JSON (or [DONE]); errors inside a stream are not 5xx either."""
    for line in r.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: ") :])
        assert "error" not in event or event["error"]["code"] not in range(500, 600), event


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


@SETTINGS
@given(
    request=st.one_of(posts, posts, posts, gets.map(lambda g: ("GET", g))),
    content_type=st.sampled_from(["application/json"] * 12 + ["text/plain", None]),
)
def test_fuzz_every_route(http: httpx.Client, request: tuple[str, Any], content_type: str | None) -> None:
    path, body = request
    if path == "GET":
        get_path, params = body
        r = http.get(get_path, params=params)
        assert r.status_code in (200, 404), (get_path, r.status_code, r.text)
        check_error(r, None, None)
        if r.status_code == 404:
            assert get_path.startswith("/v1/models/") and r.json()["error"]["param"] == "model"
        return
    if path in REQUIRED and not (
        isinstance(body.get(REQUIRED[path]), int)
        or isinstance(body.get("max_completion_tokens"), int)
        and not isinstance(body.get("max_completion_tokens"), bool)
    ):
        body[REQUIRED[path]] = 4
    raw = json.dumps(body).encode()  # NaN and Infinity included, as Python writes them
    headers = {} if content_type is None else {"content-type": content_type}
    with http.stream("POST", path, content=raw, headers=headers) as r:
        if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
            drain_stream(r)
            return
        r.read()
    if content_type != "application/json":
        assert r.status_code == 415, r.text
    check_error(r, MODELS_OF_ROUTE[path], body)
    if r.status_code == 400 and isinstance(body, dict) and content_type == "application/json":
        message = r.json()["error"]["message"]
        # a field's fault names the field; only faults of the whole request name none
        if r.json()["error"]["param"] is None:
            assert "flushed while requests are running" in message or "JSON" in message, (message, body)


def test_after_the_fuzz_the_server_serves_and_holds_no_kv(http: httpx.Client) -> None:
    def settled() -> dict[str, int] | None:
        load = http.get("/server_info").json()["load"]
        return load if load["running"] == 0 and load["waiting"] == 0 else None

    load = wait_until(settled, timeout=60)
    assert load["kv_used"] == load["cached_tokens"], load
    r = http.post("/v1/completions", json={"prompt": "still here", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert http.get("/health").status_code == 200
