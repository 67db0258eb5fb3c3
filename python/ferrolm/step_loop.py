"""The step loop: the core plans, the runner forwards (or samples on its device), the core
commits. One loop for ``ferrolm.Engine`` (which commits on the core and turns the
``StepOutputs`` into deltas) and for ``ferrolm serve`` (which commits through the Rust
front end, ``_core.Frontend``, whose commits hand the outputs straight to the HTTP
streams).

Each step runs the runner in the best mode it has for the plan:

- device greedy (``runner.forward_greedy``): every entry that samples is plain greedy
  (``plan.all_plain_greedy``; the rule lives in the core, ``RequestParams::plain_greedy``)
  and the runner picks the argmaxes on its device, EOS excluded where ``plan.ignore_eos``
  says so; only B ids reach the host. A step in which a thinking budget forces a request's
  end-of-thinking token is not all plain greedy: it runs in one of the modes below, the
  forced token being the one token the core's mask allows;
- device sampling (``runner.forward_sample`` with ``core.sampling_batch()``): the runner
  draws every token on its device under the core's sampling columns (penalties, bias,
  grammar masks, seeds), and hands ids and the logprobs asked for to ``commit_tokens``;
- logits (``runner.forward``): the core's sampler reads the logits on the host (``commit``).
  Always so for a plan that verifies drafts (speculative decoding, ``plan.has_drafts``):
  the runner returns a row per draft token as well (``plan.logit_rows``), and the core
  draws them one after another, each once the one before was kept.

Both device modes are on by default where the runner's device is not the CPU (on the CPU
the core reads the logits in place, at no copy). The loop keeps no state about requests:
what the runner needs comes with each plan.

A forward that raises ends the step in ``fail_step``: its requests finish with an error
(``error_kind`` "step_failed") and the loop keeps serving. The loop times its own forward
(wall time and its thread's CPU time) and hands the figures to the front end's commit,
which exports them on ``/metrics`` (``ferrolm:forward_seconds``,
``ferrolm:forward_loop_cpu_seconds_total``); ``ferrolm bench serve`` reads them there.

The server's loop, once idle for ``IDLE_WAIT_S`` after steps, hands what the steps freed
(a prefill chunk's activations, logits) back to the OS (``release_free_heap``): the C
allocator otherwise keeps the largest burst's buffers resident while the server idles.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ferrolm import _core
from ferrolm._memory import release_free_heap
from ferrolm.errors import CorePanicError
from ferrolm.model import ForwardBatch, ModelRunner

log = logging.getLogger("ferrolm.step_loop")

IDLE_WAIT_S = 0.25  # how long an idle loop blocks before it looks at its stop flag again


def wanted(choice: bool | None, runner: Any, method: str) -> bool:
    """A device mode's setting: on where asked for (``None``: where the runner's device is
    not the CPU) and the runner has ``method``."""
    on_cpu = str(getattr(runner, "device", "cpu")) == "cpu"
    return ((not on_cpu) if choice is None else choice) and hasattr(runner, method)


class StepLoop:
    """Runs the core's plans through ``runner`` and commits them.

    ``frontend``: commit through this ``_core.Frontend`` (outputs to its streams; each
    commit returns the finished rids) instead of on the core (each commit returns the
    ``StepOutputs``). ``kv_publisher``: publish the prefix cache's KV events
    (``ferrolm.kv_publisher``), a step's outputs going out only once the earlier batches
    are on the socket. ``on_interrupt``: given the outputs of a step whose forward was
    interrupted (``KeyboardInterrupt``, ...) before that propagates."""

    def __init__(
        self,
        core: _core.Engine,
        runner: Any,
        *,
        eos_token_ids: Sequence[int] = (),
        device_greedy: bool | None = None,
        device_sampling: bool | None = None,
        frontend: _core.Frontend | None = None,
        kv_publisher: Any = None,
        on_interrupt: Callable[[Any], None] | None = None,
    ) -> None:
        self.core = core
        self.runner = runner
        self.frontend = frontend
        self.kv_publisher = kv_publisher
        self.on_interrupt = on_interrupt
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = core.vocab_size
        self.device_greedy = wanted(device_greedy, runner, "forward_greedy")
        self.device_sampling = wanted(device_sampling, runner, "forward_sample")
        self.greedy_steps = 0  # steps whose tokens the runner picked greedily
        self.sampling_steps = 0  # steps whose tokens the runner drew
        self.forward_seconds = 0.0  # wall time in the forward (on the core; the front end keeps its own)
        self.forward_steps = 0
        self.stopping = threading.Event()
        # the core's plan is the batch of the runners made here (same columns, checked by
        # the core); any other runner gets a ForwardBatch, as it always has
        self._plan_is_batch = isinstance(runner, ModelRunner)
        self._commit: Callable[..., Any]
        self._commit_tokens: Callable[..., Any]
        if frontend is None:
            self._commit, self._commit_tokens = (self._core_commit, self._core_commit_tokens)
            self._fail: Callable[[str], Any] = core.fail_step
            self._take: Callable[[], Any] = core.take_outputs
        else:
            self._commit = functools.partial(frontend.commit, core)
            self._commit_tokens = functools.partial(frontend.commit_tokens, core)
            self._fail = functools.partial(frontend.fail_step, core)
            self._take = functools.partial(frontend.take_outputs, core)
        if kv_publisher is not None and frontend is not None:
            kv_publisher.on_change = self._note_kv_events

    # ---- one step ----

    def step(self, plan: _core.BatchPlan) -> Any:
        """Runs ``plan`` (non-empty) and commits it: the commit's result (``StepOutputs``
        on the core; the finished rids through the front end)."""
        runner, kv = self.runner, self.kv_publisher
        batch = plan if self._plan_is_batch else ForwardBatch.from_plan(plan)
        thread_time, perf_counter = time.thread_time, time.perf_counter
        try:
            # the thread's clock outermost, so that the wall clock's reads count as forward
            c0 = thread_time()
            w0 = perf_counter()
            if self.device_greedy and plan.all_plain_greedy:
                ids = runner.forward_greedy(batch, self.eos_token_ids, plan.ignore_eos, vocab_size=self.vocab_size)
                w1 = perf_counter()
                c1 = thread_time()
                if kv is not None:  # the earlier steps' events go out before this step's outputs
                    kv.wait_earlier()
                out = self._commit_tokens(ids, forward_s=w1 - w0, forward_cpu_s=c1 - c0)
                self.greedy_steps += 1
            elif self.device_sampling and not plan.has_drafts:
                draws = runner.forward_sample(batch, self.core.sampling_batch(), vocab_size=self.vocab_size)
                w1 = perf_counter()
                c1 = thread_time()
                if kv is not None:  # the earlier steps' events go out before this step's outputs
                    kv.wait_earlier()
                out = self._commit_tokens(**draws.commit_args(), forward_s=w1 - w0, forward_cpu_s=c1 - c0)
                self.sampling_steps += 1
            else:
                logits = runner.forward(batch)
                w1 = perf_counter()
                c1 = thread_time()
                if kv is not None:  # the earlier steps' events go out before this step's outputs
                    kv.wait_earlier()
                out = self._commit(logits, w1 - w0, c1 - c0)
        except CorePanicError:
            raise  # the core refuses further use
        except BaseException as e:
            # The step's KV was not written (or not all of it): the core drops the step and
            # its requests end with an error (error_kind "step_failed"; clients get no
            # internals). The loop keeps serving.
            out = self._fail(f"the model forward failed: {type(e).__name__}: {e}")
            if isinstance(e, Exception):
                log.exception("a step of %d requests failed; they end with an error", len(plan))
                return out
            if self.on_interrupt is not None:
                self.on_interrupt(out)
            raise
        return out

    def take_outputs(self) -> Any:
        """Outputs made outside a step (aborts, queue timeouts)."""
        return self._take()

    def _core_commit(self, logits: Any, forward_s: float, forward_cpu_s: float) -> Any:
        self.forward_seconds += forward_s
        self.forward_steps += 1
        return self.core.commit(logits)

    def _core_commit_tokens(self, tokens: Any, *, forward_s: float, forward_cpu_s: float, **draws: Any) -> Any:
        self.forward_seconds += forward_s
        self.forward_steps += 1
        return self.core.commit_tokens(tokens, **draws)

    # ---- the server's loop ----

    def run(self) -> None:
        """Steps until ``stopping`` is set, fed and drained by the front end; blocks in
        ``frontend.wait`` while there is no work (no busy spin; a request wakes it)."""
        assert self.frontend is not None, "run() is the server's loop: give a frontend"
        if self.kv_publisher is not None:
            self._run_with_kv_events()
            return
        # One call into the core before the forward (next_plan: drain and schedule) and one
        # after (the commit), and the plan goes to the runner as its batch. At low
        # concurrency the Python work between forwards is most of what a token costs the
        # server outside the forward, so nothing else is done per step.
        frontend, core, stopping = self.frontend, self.core, self.stopping
        next_plan, wait, take, step = (frontend.next_plan, frontend.wait, self._take, self.step)
        stepped = False  # since the loop last handed freed memory back
        while not stopping.is_set():
            plan = next_plan(core)
            if plan is None:
                if not wait(IDLE_WAIT_S) and stepped:
                    release_free_heap()  # a quiet interval after work (module docstring)
                    stepped = False
            elif not plan:
                take()  # aborts and timeouts of waiting requests
            else:
                step(plan)
                stepped = True

    def _run_with_kv_events(self) -> None:
        """``run`` with KV events: the events of aborts and flushes as a batch after the
        drain that ran them, a step's as a batch after its commit."""
        frontend, core = self.frontend, self.core
        assert frontend is not None
        stepped = False
        while not self.stopping.is_set():
            frontend.drain(core)
            self._publish_kv_events()
            if not core.has_work():
                if not frontend.wait(IDLE_WAIT_S) and stepped:
                    release_free_heap()
                    stepped = False
                continue
            plan = core.schedule()
            if len(plan) == 0:
                self._take()  # aborts and timeouts of waiting requests
            else:
                self.step(plan)
                stepped = True
            self._publish_kv_events()

    # ---- KV events ----

    def _publish_kv_events(self) -> None:
        """The cache's events since the last call, as one batch (none when empty)."""
        self.kv_publisher.publish_from(self.core)

    def _note_kv_events(self) -> None:
        p, frontend = self.kv_publisher, self.frontend
        if p is not None and frontend is not None:
            frontend.note_kv_events(p.queued, p.sent, p.dropped, p.replays, p.late)
