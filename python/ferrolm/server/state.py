"""What every route handler shares: the settings, the engine client, the tokenizer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import cached_property

from fastapi import Request

from ferrolm.model.tokenizer import Tokenizer
from ferrolm.server.args import ServerArgs
from ferrolm.server.engine_client import EngineClient, EngineUnavailable
from ferrolm.server.errors import APIError
from ferrolm.server.generation import Generation, Sample
from ferrolm.server.sse import EventStreamResponse

READY_TIMEOUT_S = 120.0  # a request made while the engine starts waits this long for it


@dataclass(eq=False)
class ServerState:
    args: ServerArgs
    client: EngineClient
    tokenizer: Tokenizer
    started_at: float = field(default_factory=time.time)
    # requests in flight by their public id (/generate's rid, the OpenAI response id),
    # for /abort_request
    named: dict[str, Generation] = field(default_factory=dict)

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

    @property
    def context_length(self) -> int:
        return int(self.client.info["max_context_length"])

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
