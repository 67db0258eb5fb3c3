"""One HTTP request's generation: its samples in the engine, what each has produced so far,
and the usage to report. Shared by the OpenAI endpoints and ``/generate``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from ferrolm.engine import Delta, Output
from ferrolm.errors import InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.engine_client import ENGINE_UNAVAILABLE_KIND, EngineClient, EngineError, EngineUnavailable, RequestHandle
from ferrolm.server.errors import APIError, from_invalid_input


@dataclass(slots=True)
class Sample(Output):
    """One choice: everything its deltas have brought so far."""

    index: int = 0  # the choice index: prompt_index * n + j
    first_of_prompt: bool = False  # the sample whose usage counts the prompt


class Generation:
    """Submit prompts, then read updates until every sample has finished. ``close()``
    aborts whatever still runs, so a client that goes away frees its KV."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.handle = RequestHandle()
        self.samples: dict[int, Sample] = {}  # by rid
        self.closed = False

    async def add(self, input_ids: Any, params: SamplingParams, prompt_index: int,
                  field_names: dict[str, str], **core_kw: Any) -> None:
        args = self.client.args
        if args.max_queued_requests is not None:
            # the samples of a request need not run together (the core queues them), but
            # all of them are held at once, running or waiting: more than the server ever
            # holds will never fit, a retry cannot help
            limit = args.max_running_requests + args.max_queued_requests
            wanted = len(self.samples) + params.n  # this request's samples (prompts x n)
            if wanted > limit:
                prompts = f" ({prompt_index + 1} prompts x n={params.n})" if prompt_index else ""
                raise APIError(400, f"n: {wanted} samples{prompts} are more than the server can ever hold: "
                                    f"{limit} ({args.max_running_requests} running + {args.max_queued_requests} "
                                    "waiting); lower n", "n")
            if self.client.in_flight + params.n > limit:
                raise APIError(429, f"the server is at capacity ({self.client.in_flight} requests running or "
                                    "waiting); retry later", code="queue_full")
        if args.queue_timeout is not None:
            core_kw.setdefault("queue_timeout", args.queue_timeout)
        try:
            rids = await self.client.submit(self.handle, input_ids, params, **core_kw)
        except InvalidInputError as e:
            raise from_invalid_input(e, field_names) from None
        except EngineUnavailable as e:
            raise APIError(503, str(e), code="engine_unavailable") from None
        except EngineError as e:
            raise APIError(500, f"the engine could not take the request: {e}") from None
        for j, rid in enumerate(rids):
            self.samples[rid] = Sample(index=prompt_index * params.n + j, first_of_prompt=j == 0)

    async def updates(self) -> AsyncIterator[list[tuple[Sample, Delta]]]:
        """Batches of (sample, what it produced since the last batch), as they arrive;
        several deltas of one sample are merged into one."""
        while not self.handle.finished:
            merged: dict[int, Delta] = {}
            for d in await self.handle.next_deltas():
                self.samples[d.rid].add(d)
                if d.rid in merged:
                    merged[d.rid] = merge_deltas(merged[d.rid], d)
                else:
                    merged[d.rid] = d
            yield [(self.samples[rid], d) for rid, d in merged.items()]

    async def run_to_end(self, request: Request) -> list[Sample]:
        """Every sample, finished, by choice index; aborts them if the client disconnects."""
        async def collect() -> None:
            async for _ in self.updates():
                pass

        done = asyncio.ensure_future(collect())
        gone = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not done.done():
                done.cancel()
        if not done.done() or done.cancelled():
            raise ClientGone()
        done.result()
        return self.ordered()

    def ordered(self) -> list[Sample]:
        return sorted(self.samples.values(), key=lambda s: s.index)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.release(self.handle)

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage: each prompt counted once (its first sample's numbers), every
        sample's completion tokens."""
        prompt = sum(s.prompt_tokens for s in self.samples.values() if s.first_of_prompt)
        cached = sum(s.cached_tokens for s in self.samples.values() if s.first_of_prompt)
        completion = sum(len(s.token_ids) for s in self.samples.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def raise_for_errors(self) -> None:
        for s in self.samples.values():
            if s.finish_reason == "error":
                raise error_of(s)


def error_of(finished: Output | Delta) -> APIError:
    """A request that finished with an error, by the error's kind: 503 if it waited too
    long in the queue (the server is overloaded, a retry may succeed) or the engine died
    or stopped answering, else 500."""
    message = finished.error
    if finished.error_kind == ENGINE_UNAVAILABLE_KIND:
        return APIError(503, f"{message}", code="engine_unavailable")
    if finished.error_kind == "queue_timeout":
        return APIError(503, f"the server is overloaded: the request {message}", code="queue_timeout")
    return APIError(500, f"generation failed: {message}")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def wait_for_disconnect(request: Request) -> None:
    # the body has been read: the next ASGI message is the disconnect
    while (await request.receive())["type"] != "http.disconnect":
        pass


def merge_deltas(a: Delta, b: Delta) -> Delta:
    """``a`` then ``b`` of the same request, as one delta (``b`` may finish it)."""
    return Delta(a.rid, a.token_ids + b.token_ids, a.text + b.text, a.logprobs + b.logprobs,
                 a.top_logprobs + b.top_logprobs, finish_reason=b.finish_reason, matched_stop=b.matched_stop,
                 error=b.error, error_kind=b.error_kind, prompt_tokens=b.prompt_tokens,
                 cached_tokens=b.cached_tokens, completion_tokens=b.completion_tokens)
