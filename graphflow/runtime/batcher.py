"""A replica's engine loop: node requests share forward passes, step by step.

Requests enter a bounded queue. Each step the loop runs one ragged forward
(:func:`graphflow.models.ragged.forward_rows`) over every running request: one token for each
request that is decoding, then the pending prefills that finish within ``max_batch_tokens``,
shortest first, or, when none does, a ``max_batch_tokens`` chunk of the shortest. A request
leaves as soon as it has its tokens; a new one joins at the next step. A long prefill therefore
runs in chunks between the decodes and short prefills that arrive meanwhile. A short prefill
that arrives while a step with prefill rows runs does not wait for that step: the step pauses
after its current decoder layer (:func:`graphflow.models.ragged.forward_layers`), the short
prefill runs as a step of its own, and the paused step then goes on from the next layer
(head-of-line blocking bounded by one layer).

Design kept, and why (the served benchmark, ``graphflow bench serve``, measures it against the
unbatched path; its table is in ``experiments/throughput/README.md``):

* **per-row caches with the linear layers packed** (the varlen layout of vLLM, without its
  kernels): each request keeps its own ``DynamicCache`` and attends over it alone, so rows of
  any length share a step with no padding and no attention mask, and a request's KV is never
  copied into a batch tensor.
* **each row's room reserved**: a new request's cache is a
  :class:`~graphflow.models.row_cache.RowCache` sized for every token it will hold, written in
  place (a ``DynamicCache`` reallocates every layer at every step), and when the node is kept its
  tokens are copied into stored blocks a layer (long KV: a group of blocks) at a time while the
  room's pages go back to the OS, so a finished node does not hold its KV twice.
* **padding + attention masks** (one ``DynamicCache`` of batch ``n``, as the scripted agents job
  builds with ``packing.batch_cache``) needs rows of one length: every row's prefix copied into
  the batch and re-copied as rows join or leave, which is what kept that job's peak at 0.63×
  dense.
* **transformers' continuous batching** (``generate_batch``, its paged cache) runs its own
  request manager and cache and cannot start from KV the replica received or kept, so it
  cannot serve a reused or transferred prefix at all.
* **shared prefix, read in place**: requests that continue one stored prefix read the stored
  blocks themselves (:class:`~graphflow.models.ragged.SharedPrefix`). A decode step's few
  queries attend over them with a kernel of this repo's that reads each block where it lies
  (:mod:`graphflow.models.prefix_kernel`, float32 or bfloat16 KV, AVX-512, else portable 8-float vectors: AVX2, Arm;
  built at the replica's start; ``status --json`` gives each replica's ``prefix_reading``, e.g.
  ``in place (avx512)``): half the time of gathering each layer and running torch's flash over
  it (23.5 against 47 ms of a 16-row step over 8 prefixes of 1,024 SmolLM2 tokens, scratch
  timings; the portable build, forced to AVX2 here, 0.71× gather + flash's time at that head
  dimension). Without the kernel (no C compiler), and for a
  prefill chunk's many queries, each step gathers one
  layer at a time into the loop thread's gather buffer (one for every prefix, of the largest
  layer gathered: a buffer per prefix cost ~10 MiB more peak growth for 16 agents over one 4K
  SmolLM2 root, made and dropped per request), attends it once for all of them and merges
  it with each row's own suffix by log-sum-exp. The joined copy of the prefix it replaced
  (up to dde04e8) cost the whole prefix again per shared context (180 MiB for a 4K SmolLM2
  root). The gather reads what attention over a copy would read, and the layer it writes is
  still in cache when attention reads it; what it costs in tokens/s is in the served bench.
* **the linear layers on the faster kernel of the host**: a many-row step is bound by its
  matrix products, which torch's BLAS ran at 62 GFLOP/s on this host's 16-row steps and oneDNN
  at 108, so each replica times both at start and keeps the faster
  (:mod:`graphflow.models.linear_kernel`). The unbatched path uses the same kernel: its one-row
  steps, bound by reading the weights, gained from it only in the head.
* **shortest prefill first, nothing long beside it**: a step runs the prefills that finish in it;
  only when none does, a chunk of the shortest.
* **a running step pauses between layers for a short arrival**: a chunk's cost grows with its
  position (SmolLM2-135M on one core: a 128-token chunk 0.26 s at position 512, 0.51 s at
  3,968, more than a short node's whole prefill), so waiting for the step already running
  cost a short request up to 2.75× its idle TTFT. Pausing at a layer boundary costs nothing
  (each row's cache is complete up to the layer done; only the paused step's hidden states are
  kept) and needs no smaller chunks: shrinking chunks with position to bound each step's cost
  made a 4K prefill 54 steps instead of 32 and 15% slower alone. Only one step is paused at a
  time, and only a request the plan would have run first pauses it (its prefill finishes in
  one step, or has fewer tokens left than the chunked one: a short node's prefill of 186
  tokens takes two steps of 128); decode-only steps run through.

The loop is a plain class: :meth:`Batcher.step` runs one step (tests drive it directly);
:meth:`Batcher.start` runs steps on a thread of its own until :meth:`Batcher.stop`. With
``threads`` that thread is the only one of the process whose torch kernels run in parallel
(:mod:`graphflow.models.threads`: a second parallel thread slows every forward by about 1.6×
on 2 cores), and :meth:`Batcher.call` runs other engine work there between steps (calibration).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from graphflow.models.engine import Engine
from graphflow.models.gemm_padding import GemmPadding
from graphflow.models.ragged import Row, SharedPrefix, forward_layers, unsupported
from graphflow.models.threads import set_thread_parallelism
from graphflow.runtime.batch_limits import BATCH_ROWS, MAX_BATCH_TOKENS

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["Batcher", "BatcherFull", "Request"]

T = TypeVar("T")
_Forward = Generator[int, None, list[torch.Tensor | None]]


class BatcherFull(Exception):
    """The queue holds its bound of requests; retry when one finishes."""


@dataclass(eq=False)
class Request:
    """Run ``tokens`` after ``shared`` + ``cache``, then greedily generate until ``max_new``
    tokens exist (the first one from the last prompt token's logits). ``cache`` ends holding
    every token but the last generated one, as ``Engine.decode_greedy`` leaves it."""

    tokens: list[int]
    cache: DynamicCache
    shared: SharedPrefix | None
    max_new: int
    output: list[int] = field(default_factory=list)
    _fed: int = 0  # prompt tokens already run
    _done: threading.Event = field(default_factory=threading.Event)
    _first: threading.Event = field(default_factory=threading.Event)
    _error: BaseException | None = None

    @property
    def prefill_left(self) -> int:
        return len(self.tokens) - self._fed

    def wait_first(self, timeout: float | None = None) -> int:
        """Block until the first token exists; returns it."""
        if not self._first.wait(timeout):
            raise TimeoutError("the engine loop produced no first token in time")
        self._raise()
        return self.output[0]

    def result(self, timeout: float | None = None) -> list[int]:
        """Block until every token exists; returns them (raises what the forward raised)."""
        if not self._done.wait(timeout):
            raise TimeoutError("the engine loop did not finish the request in time")
        self._raise()
        return list(self.output)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _finish(self, error: BaseException | None = None) -> None:
        if self._done.is_set():  # NOTE: stop() may fail a request the running step then finishes
            return
        self._error = error
        self._first.set()
        self._done.set()


_Batch = list[tuple[Request, list[int]]]  # a step's rows: each request with the tokens it runs


class Batcher:
    """The engine loop of one replica (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        max_batch_tokens: int = MAX_BATCH_TOKENS,
        max_rows: int = BATCH_ROWS,
        max_queue: int = 64,
        threads: int = 0,
    ) -> None:
        """``threads`` > 0: the loop's thread runs torch kernels on that many threads, whatever
        the rest of the process uses (0: as the process is set)."""
        why = unsupported(engine.model)
        if why:
            raise ValueError(why)
        if max_rows < 1 or max_queue < 1 or max_batch_tokens <= max_rows:
            raise ValueError(
                f"need max_rows ≥ 1, max_queue ≥ 1 and max_batch_tokens > max_rows (a step must hold "
                f"every decode and some prefill), got {max_batch_tokens}, {max_rows}, {max_queue}"
            )
        self.engine = engine
        self.max_batch_tokens = max_batch_tokens
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.threads = threads
        self._calls: list[tuple[Future[Any], Callable[[], Any]]] = []
        self._waiting: list[Request] = []
        self._running: list[Request] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.steps = 0
        self.rows_run = 0  # forward rows over all steps (rows ÷ steps: how much the loop batched)
        self.peak_rows = 0
        self.peak_queue = 0
        self.pauses = 0  # forwards paused between two layers for a short prefill
        self.busy_s = 0.0  # wall seconds spent in forwards (steps and the parts of paused ones)
        self.padding: GemmPadding | None = None  # the rows a step's MLP and head run over (None: unpadded)
        self._paused: tuple[_Forward, _Batch] | None = None

    # ---- requests ------------------------------------------------------------------------
    def submit(
        self,
        tokens: Sequence[int],
        cache: DynamicCache | None = None,
        shared: SharedPrefix | None = None,
        max_new: int = 1,
    ) -> Request:
        """Queue a request (see :class:`Request`); raises ``BatcherFull`` at the queue's bound."""
        if not tokens:
            raise ValueError("a request needs at least one token to run")
        if max_new < 1:
            raise ValueError(f"max_new must be at least 1, got {max_new}")
        # NOTE: a new request's cache reserves room for every token it will hold (prompt, then
        # all it generates but the last), so it never reallocates and ends as stored blocks, never held twice
        req = Request(
            list(tokens),
            cache if cache is not None else self.engine.new_cache(len(tokens) + max_new - 1),
            shared,
            max_new,
        )
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine loop was stopped")
            if len(self._waiting) + len(self._running) >= self.max_queue:
                raise BatcherFull(f"the engine queue holds its bound of {self.max_queue} requests")
            self._waiting.append(req)
            self.peak_queue = max(self.peak_queue, len(self._waiting) + len(self._running))
            self._cv.notify_all()
        return req

    def generate(
        self,
        tokens: Sequence[int],
        cache: DynamicCache | None = None,
        shared: SharedPrefix | None = None,
        max_new: int = 1,
    ) -> list[int]:
        """:meth:`submit` and wait for the tokens (the loop must be running)."""
        return self.submit(tokens, cache, shared, max_new).result()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the loop's thread, between two steps, and its result (or what it
        raised); inline before the loop thread starts, or when called from it."""
        done: Future[T] = Future()
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine loop was stopped")
            inline = self._thread is None or threading.current_thread() is self._thread
            if not inline:
                self._calls.append((done, lambda: fn(*args)))
                self._cv.notify_all()
        return fn(*args) if inline else done.result()

    def measure_padding(self) -> GemmPadding | None:
        """Measure on the loop's thread (:meth:`call`) how many rows each step's MLP and head
        should run over on this host (:meth:`GemmPadding.measure
        <graphflow.models.gemm_padding.GemmPadding.measure>`), and pad every later step so. On
        the CPU only: no other device's kernels were measured, so those steps stay unpadded."""
        if self.engine.device.type == "cpu":
            self.call(self._pad_as_measured)
        return self.padding

    def _pad_as_measured(self) -> None:
        self.padding = GemmPadding.measure(self.engine.model)  # NOTE: set between two steps, on the loop's thread

    @property
    def queue_length(self) -> int:
        """Requests waiting or running."""
        with self._cv:
            return len(self._waiting) + len(self._running)

    # ---- the loop ------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """One forward over the running requests (admitting waiting ones first), or the rest of
        a paused one; returns the requests that finished in it (none when it paused)."""
        with self._cv:
            room = self.max_rows - len(self._running)
            self._running += self._waiting[:room]
            del self._waiting[:room]
            forward: _Forward | None = None
            if self._paused is None:
                batch = self._plan([])
            elif self._short_ready(self._paused[1]):
                batch = self._plan(self._paused[1])  # NOTE: runs through: one step is paused at a time
            else:
                (forward, batch), self._paused = self._paused, None
            pausable = self._paused is None
            self.peak_rows = max(self.peak_rows, len(batch))
        if not batch:
            return []
        if forward is None:
            rows = [Row(t, r.cache, r.shared, logits=r._fed + len(t) >= len(r.tokens)) for r, t in batch]
            forward = forward_layers(self.engine.model, rows, self.padding)
        begin = time.perf_counter()
        try:
            logits = self._run(forward, batch, pausable and any(len(t) > 1 for _, t in batch))
        except Exception as exc:  # every request of the step gets the error; the loop goes on
            finished = [r for r, _ in batch]
            with self._cv:
                self._running = [r for r in self._running if r not in finished]
            for r in finished:
                r._finish(exc)
            return finished
        finally:
            self.busy_s += time.perf_counter() - begin
        if logits is None:
            return []
        finished = []
        for (r, tokens), out in zip(batch, logits, strict=True):
            r._fed += len(tokens) if r.prefill_left else 0
            if out is None:
                continue
            r.output.append(int(torch.argmax(out)))
            if len(r.output) == 1:
                r._first.set()
            if len(r.output) >= r.max_new:
                finished.append(r)
        with self._cv:
            self._running = [r for r in self._running if r not in finished]
            self.steps += 1
            self.rows_run += len(batch)
        for r in finished:
            r._finish()
        return finished

    def _run(self, forward: _Forward, batch: _Batch, pausable: bool) -> list[torch.Tensor | None] | None:
        """Run ``forward`` layer by layer to its logits; ``None`` when it paused (see
        :meth:`_short_ready`) and waits in ``_paused`` for the next step to go on."""
        while True:
            try:
                next(forward)
            except StopIteration as done:
                return done.value
            if pausable and self._waiting:  # NOTE: a lock-free look first: a list's length is atomic
                with self._cv:
                    if self._short_ready(batch):
                        self._paused = (forward, batch)
                        self.pauses += 1
                        return None

    def _short_ready(self, busy: _Batch) -> bool:
        """Whether a request outside ``busy`` (running, or waiting with a row free for it) has a
        prefill the plan would have run before ``busy``'s: one that a step finishes, or one with
        fewer tokens left than a prefill ``busy`` runs a chunk of. Such a request is worth
        pausing ``busy``'s forward for, between two layers, so that it waits a layer instead of
        the whole step (the caller holds the lock)."""
        free = self._outside(busy)
        budget = self.max_batch_tokens - sum(1 for r in free if not r.prefill_left)
        chunked = max((r.prefill_left for r, t in busy if len(t) < r.prefill_left), default=0)
        ready = free + self._waiting[: self.max_rows - len(self._running)]
        return any(r.prefill_left > 0 and (r.prefill_left <= budget or r.prefill_left < chunked) for r in ready)

    def _outside(self, busy: _Batch) -> list[Request]:
        """The running requests that have no row in ``busy`` (the caller holds the lock)."""
        held = {id(r) for r, _ in busy}
        return [r for r in self._running if id(r) not in held]

    def _plan(self, busy: _Batch) -> _Batch:
        """This step's rows, from the running requests outside ``busy`` (a paused forward's):
        every decoding request's last token, then the prefills that finish
        within ``max_batch_tokens``, fewest remaining tokens first; a prefill that cannot finish
        gets a chunk only in a step where no other prefill finishes (the caller holds the lock).

        Finishing the shortest prefills first, with nothing long added to their step, keeps a
        short request's wait to the step already running when it arrived, and that step pauses
        for it when it holds prefill rows (:meth:`_short_ready`)."""
        running = self._outside(busy)
        batch = [(r, [r.output[-1]]) for r in running if not r.prefill_left]
        budget = self.max_batch_tokens - len(batch)
        pending = sorted((r for r in running if r.prefill_left), key=lambda r: r.prefill_left)
        for finishing, r in enumerate(pending):
            if r.prefill_left > budget:
                if not finishing and budget > 0:  # nothing finishes this step: a chunk of the shortest
                    batch.append((r, r.tokens[r._fed : r._fed + budget]))
                break
            batch.append((r, r.tokens[r._fed :]))
            budget -= r.prefill_left
        return batch

    def start(self) -> None:
        """Run steps on a daemon thread while there is work."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="graphflow-engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish the loop thread; requests still queued fail with ``RuntimeError``."""
        with self._cv:
            self._stopping = True
            left = self._waiting + self._running
            calls = self._calls
            self._waiting, self._running, self._calls = [], [], []
            self._paused = None
            self._cv.notify_all()
        for r in left:
            r._finish(RuntimeError("the engine loop was stopped"))
        for done, _ in calls:
            done.set_exception(RuntimeError("the engine loop was stopped"))
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        if self.threads:
            set_thread_parallelism(self.threads)
        while True:
            with self._cv:
                while not self._stopping and not (self._waiting or self._running or self._calls):
                    self._cv.wait()
                if self._stopping:
                    return
                calls, self._calls = self._calls, []
            for done, run in calls:
                try:
                    done.set_result(run())
                except Exception as exc:  # the caller gets it; the loop goes on
                    done.set_exception(exc)
            self.step()
