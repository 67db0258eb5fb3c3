"""Request bodies of the HTTP API, as pydantic models.

Types are strict (a string is not a number, a bool not an int) and every number is
range-checked here, at the boundary, in the width the engine core takes it (token ids
and ``top_k`` u32, token counts u64, ``priority`` i64; floats finite): a value the core
could not even receive is a 400 naming the field, never an overflow deep inside.

Unknown fields are refused (400 naming the field): a misspelled or unsupported option
must not be dropped without a word. The few OpenAI fields that change nothing about the
generation are declared and ignored (``IGNORED_FIELDS``; the server README lists them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

TokenId = Annotated[int, Field(ge=0, le=U32_MAX)]
TokenCount = Annotated[int, Field(ge=0, le=U64_MAX)]
Priority = Annotated[int, Field(ge=I64_MIN, le=I64_MAX)]
# the prefix cache's namespace: requests see only cache entries of their own salt
CacheSalt = Annotated[str, Field(min_length=1, max_length=512)]

# accepted so that OpenAI's clients keep working, and ignored: none changes the tokens
IGNORED_FIELDS = {
    "user": "an end-user id for OpenAI's abuse monitoring",
    "safety_identifier": "an end-user id for OpenAI's abuse monitoring",
    "store": "asks OpenAI to keep the completion; nothing is stored here",
    "metadata": "tags for stored completions; nothing is stored here",
    "service_tier": "OpenAI's billing and latency tier",
    "prompt_cache_key": "a routing hint for OpenAI's cache; the prefix cache here is automatic "
                        "(cache_salt, not this, separates tenants)",
    "cache_prompt": "llama.cpp's switch for reusing the prompt's KV; the prefix cache here is always "
                    "on, and cached KV gives the same tokens as computed KV",
}

# fields other servers accept that this one does not: refused with a reason, not as typos
UNSUPPORTED_FIELDS = {
    "lora_path": "LoRA adapters are not supported",
    "lora_request": "LoRA adapters are not supported",
    "guided_decoding_backend": "there is one structured-output engine; the backend cannot be chosen",
    "guided_whitespace_pattern": "the whitespace of structured output cannot be set",
    "structured_outputs": "use guided_json, guided_regex, guided_choice, json_schema, regex or response_format",
    "functions": "the legacy function calling is not supported; use tools and tool_choice",
    "function_call": "the legacy function calling is not supported; use tools and tool_choice",
    "image_data": "images are not supported",
    "audio": "audio is not supported",
    "modalities": "only text output is supported",
}


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class OpenAISampling(_Body):
    """What completions and chat completions share."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=U64_MAX)
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=U64_MAX)
    # extra sampling fields, as SGLang and vLLM accept them
    top_k: int | None = Field(default=None, ge=-1, le=U32_MAX)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    ignore_eos: bool = False
    min_tokens: TokenCount = 0
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: Priority | None = None  # with --schedule-policy priority: larger runs first
    cache_salt: CacheSalt | None = None
    # structured output (SGLang's names, then vLLM's guided_* names)
    response_format: ResponseFormat | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_grammar: str | None = None  # GBNF / EBNF (a Lark grammar does not parse: 400)
    grammar: str | None = None  # llama.cpp's name for a GBNF grammar
    # accepted and ignored (IGNORED_FIELDS)
    user: str | None = None
    cache_prompt: bool | None = None


class CompletionRequest(OpenAISampling):
    # left to right: the first type that fits wins, without trying the rest on a long list
    prompt: str | list[TokenId] | list[list[TokenId]] | list[str] = Field(union_mode="left_to_right")
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=U32_MAX)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema; absent: no parameters
    strict: bool | None = None  # OpenAI's strict mode for the arguments


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(_Body):
    name: str
    arguments: str | dict[str, Any]  # OpenAI sends JSON text; Hugging Face style, a mapping


class ToolCallMessagePart(_Body):
    """A call in an assistant message of the history, as OpenAI returned it."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction
    index: int | None = None  # what clients that rebuild streamed calls leave in


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallMessagePart] | None = None
    # what OpenAI's assistant messages carry when sent back: harmless
    refusal: str | None = None
    annotations: list[Any] | None = None
    reasoning_content: str | None = None  # a reasoning model's thinking, as this server returns it


class ChatCompletionRequest(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=U64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # default true; without tools, nothing to do
    # variables for the chat template (vLLM's and SGLang's field), e.g. Qwen3's enable_thinking
    chat_template_kwargs: dict[str, Any] | None = None
    # accepted and ignored (IGNORED_FIELDS)
    safety_identifier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None


class NativeSamplingParams(_Body):
    """``sampling_params`` of ``/generate``, named as SGLang names them."""

    max_new_tokens: int = Field(default=128, ge=1, le=U64_MAX)
    min_new_tokens: TokenCount = 0
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=U32_MAX)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = Field(default=None, ge=0, le=U64_MAX)
    n: int = Field(default=1, ge=1, le=128)
    logit_bias: dict[str, float] | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None


class GenerateRequest(_Body):
    text: str | None = None
    input_ids: list[TokenId] | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=lambda: NativeSamplingParams())
    stream: bool = False
    rid: str | None = None
    return_logprob: bool = False
    top_logprobs_num: int = Field(default=0, ge=0, le=20)
    priority: Priority | None = None
    cache_salt: CacheSalt | None = None
    # tool calls over the native API: the prompt is the caller's (tools are not rendered
    # into it); the output is constrained and parsed as for chat completions
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    separate_reasoning: bool = False  # with --reasoning-parser: the thinking apart


class AbortRequest(_Body):
    rid: str | None = None
    abort_all: bool = False


class FlushCacheRequest(_Body):
    """``/flush_cache`` takes no options (an empty body or ``{}``)."""
