"""A deterministic synthetic prefix-cache workload: many multi-turn conversations sharing a
few long system prompts, arriving interleaved, as a chat service sees them.

Each request is ``(prompt, full)``: the tokens the engine looks up when the request arrives
(system prompt + every earlier turn + the new user message) and the tokens it caches when
the request finishes (the prompt plus the generated reply).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkloadConfig:
    conversations: int = 400
    system_prompts: int = 4
    system_prompt_tokens: tuple[int, int] = (800, 2000)
    turns: tuple[int, int] = (1, 6)
    user_tokens: tuple[int, int] = (20, 200)
    reply_tokens: tuple[int, int] = (20, 300)
    vocab_size: int = 100_000
    seed: int = 0


@dataclass(frozen=True)
class Request:
    prompt: np.ndarray  # int32
    full: np.ndarray  # int32, starts with prompt


def make_workload(cfg: WorkloadConfig) -> list[Request]:
    rng = np.random.default_rng(cfg.seed)

    def tokens(lo_hi: tuple[int, int]) -> np.ndarray:
        n = int(rng.integers(lo_hi[0], lo_hi[1] + 1))
        return rng.integers(0, cfg.vocab_size, size=n, dtype=np.int32)

    systems = [tokens(cfg.system_prompt_tokens) for _ in range(cfg.system_prompts)]
    # popular system prompts are shared by more conversations (Zipf-like)
    weights = 1.0 / np.arange(1, cfg.system_prompts + 1)
    weights /= weights.sum()
    conversations: list[list[Request]] = []
    for _ in range(cfg.conversations):
        history = systems[int(rng.choice(cfg.system_prompts, p=weights))]
        turns = []
        for _ in range(int(rng.integers(cfg.turns[0], cfg.turns[1] + 1))):
            prompt = np.concatenate([history, tokens(cfg.user_tokens)])
            full = np.concatenate([prompt, tokens(cfg.reply_tokens)])
            turns.append(Request(prompt, full))
            history = full
        conversations.append(turns)
    # interleave: each step continues a random live conversation
    order: list[Request] = []
    cursors = [0] * len(conversations)
    live = list(range(len(conversations)))
    while live:
        i = int(rng.integers(len(live)))
        conv = live[i]
        order.append(conversations[conv][cursors[conv]])
        cursors[conv] += 1
        if cursors[conv] == len(conversations[conv]):
            live[i] = live[-1]
            live.pop()
    return order
