"""What every route handler shares: the settings, the engine client, the tokenizer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from fastapi import Request

from ferrolm.model.tokenizer import Tokenizer
from ferrolm.server.args import ServerArgs
from ferrolm.server.engine_client import EngineClient, EngineUnavailable
from ferrolm.server.errors import APIError, bad_request
from ferrolm.server.generation import Generation, Sample
from ferrolm.server.prompt_bounds import max_input_chars_per_token, min_tokens
from ferrolm.server.sse import EventStreamResponse

READY_TIMEOUT_S = 120.0  # a request made while the engine starts waits this long for it
# tokenizing (and rendering chat templates) runs on these threads, never on the event
# loop: HF tokenizers release the GIL, so a megabyte prompt delays no other route. Two
# threads: the machine's other cores belong to the engine process.
TOKENIZER_THREADS = 2

T = TypeVar("T")


@dataclass(eq=False)
class ServerState:
    args: ServerArgs
    client: EngineClient
    tokenizer: Tokenizer
    started_at: float = field(default_factory=time.time)
    # requests in flight by their public id (/generate's rid, the OpenAI response id),
    # for /abort_request
    named: dict[str, Generation] = field(default_factory=dict)
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="ferrolm-tokenize"))

    def track(self, public_id: str, gen: Generation) -> Callable[[], None]:
        """Registers a request for /abort_request; returns what ends it: aborts what still
        runs and forgets the id (safe to call more than once)."""
        self.named[public_id] = gen

        def release() -> None:
            gen.close()
            if self.named.get(public_id) is gen:
                del self.named[public_id]

        return release

    def stream(self, public_id: str, gen: Generation, events: AsyncIterator[bytes]) -> EventStreamResponse:
        """An SSE response of ``events`` that releases the request however it ends."""
        return EventStreamResponse(events, self.track(public_id, gen))

    async def collect(self, request: Request, public_id: str, gen: Generation) -> list[Sample]:
        """Every sample to the end (aborted if the client goes away), released either way;
        raises the API error of a sample that failed."""
        release = self.track(public_id, gen)
        try:
            samples = await gen.run_to_end(request)
        finally:
            release()
        gen.raise_for_errors()
        return samples

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """Each token's bytes, for logprobs (built on first use: a large vocabulary takes
        a moment)."""
        return self.tokenizer.token_bytes()

    def token_text(self, token_id: int) -> str:
        raw = self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else b""
        return raw.decode("utf-8", errors="replace")

    @cached_property
    def chars_per_token(self) -> int | None:
        """The most input characters one token can stand for (``None``: no bound)."""
        return max_input_chars_per_token(self.tokenizer, self.token_bytes)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    @property
    def context_length(self) -> int:
        return int(self.client.info["max_context_length"])

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt the core can take: shorter than the context, and room in
        the KV pool for it and one more token."""
        return min(self.context_length, int(self.client.info["kv_capacity"])) - 1

    async def encode(self, text: str, param: str, *, add_special_tokens: bool = True) -> np.ndarray:
        """Token ids of a prompt, tokenized off the event loop; a text too long for the
        context even at the fewest tokens it could have is refused without tokenizing
        it (the engine must be ready: the context comes from it)."""
        self.check_text_length(text, param)
        return await self.off_loop(lambda: self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def check_text_length(self, text: str, param: str) -> None:
        at_least = min_tokens(text, self.chars_per_token)
        if at_least > self.max_prompt_tokens:
            raise bad_request(f"{param}: the prompt has at least {at_least} tokens ({len(text)} characters); "
                              f"at most {self.max_prompt_tokens} fit the context and the KV pool", param)

    async def chat_prompt(self, messages: Sequence[Mapping[str, Any]], param: str) -> np.ndarray:
        """Chat messages rendered with the template and tokenized, off the event loop."""
        text = await self.off_loop(self.tokenizer.apply_chat_template, messages)
        # the template writes its own BOS and markers
        return await self.encode(text, param, add_special_tokens=False)

    def check_model(self, requested: str | None) -> None:
        """``model`` may be omitted; if given it must be the served one."""
        if requested is not None and requested != self.args.model_name:
            raise APIError(400, f"model: {requested!r} is not served here; the model is {self.args.model_name!r}",
                           "model", "model_not_found")

    async def engine_ready(self) -> None:
        try:
            await self.client.wait_ready(READY_TIMEOUT_S)
        except EngineUnavailable as e:
            raise APIError(503, str(e)) from None


def state_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.ferrolm
    return state
