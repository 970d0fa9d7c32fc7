from __future__ import annotations

import threading
import time

import pytest

from graphflow.kv.packing import cache_length, stack_cache
from graphflow.models import prompt_token_ids
from graphflow.models.gemm_padding import GemmPadding
from graphflow.models.ragged import SharedPrefix
from graphflow.runtime.batcher import Batcher, BatcherFull


def alone(engine, prompt, n):
    pre = engine.prefill(prompt)
    first = int(pre.logits.argmax())
    return [first, *engine.decode_greedy(pre.cache, first, n - 1).token_ids] if n > 1 else [first]


def drain(batcher, limit=500):
    for _ in range(limit):
        if not batcher.queue_length:
            return
        batcher.step()
    raise AssertionError("the loop did not drain")


def test_rows_of_different_lengths_each_get_their_tokens_alone(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=24, max_rows=4)
    prompts = [prompt_token_ids(tiny_engine.tokenizer, n) for n in (70, 9, 33)]
    begin = time.perf_counter()
    reqs = [b.submit(p, max_new=n) for p, n in zip(prompts, (5, 8, 1), strict=True)]
    drain(b)
    assert [r.result() for r in reqs] == [alone(tiny_engine, p, n) for p, n in zip(prompts, (5, 8, 1), strict=True)]
    assert b.peak_rows >= 2 and b.rows_run > b.steps  # rows shared steps
    assert 0 < b.busy_s < time.perf_counter() - begin  # the forwards are timed


def test_requests_join_mid_batch_and_finished_ones_leave_without_disturbing_others(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=32, max_rows=4)
    p1, p2, p3 = (prompt_token_ids(tiny_engine.tokenizer, n) for n in (20, 40, 12))
    r1 = b.submit(p1, max_new=3)
    r2 = b.submit(p2, max_new=10)
    for _ in range(3):
        b.step()
    assert r1.done and not r2.done  # r1 left; r2 still decodes
    r3 = b.submit(p3, max_new=4)  # joins while r2 runs
    drain(b)
    assert r1.result() == alone(tiny_engine, p1, 3)
    assert r2.result() == alone(tiny_engine, p2, 10)
    assert r3.result() == alone(tiny_engine, p3, 4)


def test_a_long_prefill_runs_in_chunks_while_a_short_request_finishes(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=16, max_rows=4)
    long = b.submit(prompt_token_ids(tiny_engine.tokenizer, 160), max_new=2)
    b.step()
    short = b.submit(prompt_token_ids(tiny_engine.tokenizer, 6), max_new=1)
    steps = 0
    while not short.done:
        b.step()
        steps += 1
    assert steps == 1 and not long.done  # head-of-line blocking: one step, not the whole prefill
    assert long._fed == 16  # the short prefill's step carried no chunk of the long one
    drain(b)
    assert long.result() == alone(tiny_engine, prompt_token_ids(tiny_engine.tokenizer, 160), 2)
    assert b.steps >= 160 // 16


def step_with_arrival(batcher, engine, n_tokens, max_new):
    """One step during which a request of ``n_tokens`` arrives, once the forward's first layer
    is done (from a hook on that layer); returns what the step returned and the request."""
    got = []

    def submit(*_):
        if not got:
            got.append(batcher.submit(prompt_token_ids(engine.tokenizer, n_tokens), max_new=max_new))

    hook = engine.model.model.layers[0].mlp.register_forward_hook(submit)
    try:
        finished = batcher.step()
    finally:
        hook.remove()
    return finished, got[0]


def test_a_short_prefill_arriving_mid_step_pauses_a_long_chunk_between_layers(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=16, max_rows=4)
    long_prompt, short_prompt = (prompt_token_ids(tiny_engine.tokenizer, n) for n in (160, 6))
    long = b.submit(long_prompt, max_new=2)
    finished, short = step_with_arrival(b, tiny_engine, 6, 3)
    assert finished == [] and b.pauses == 1 and long._fed == 0  # paused after layer 0
    b.step()  # the short prefill runs while the chunk waits
    assert len(short.output) == 1 and long._fed == 0
    b.step()  # the paused chunk goes on (a decode alone does not hold it back)
    assert long._fed == 16 and b.pauses == 1
    drain(b)
    assert short.result() == alone(tiny_engine, short_prompt, 3)
    assert long.result() == alone(tiny_engine, long_prompt, 2)


def test_an_arrival_shorter_than_the_chunked_prefill_runs_all_its_steps_first(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=16, max_rows=4)
    long_prompt, mid_prompt = (prompt_token_ids(tiny_engine.tokenizer, n) for n in (160, 40))
    long = b.submit(long_prompt, max_new=1)
    _, mid = step_with_arrival(b, tiny_engine, 40, 2)  # three steps of 16, fewer left than the long
    while not mid.output:
        b.step()
        assert long._fed == 0  # the paused chunk waits for every step of the shorter prefill
    drain(b)
    assert b.pauses == 1 and mid.result() == alone(tiny_engine, mid_prompt, 2)
    assert long.result() == alone(tiny_engine, long_prompt, 1)


def test_decode_steps_and_long_arrivals_do_not_pause(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=16, max_rows=4)
    decoding = b.submit(prompt_token_ids(tiny_engine.tokenizer, 6), max_new=4)
    b.step()  # its prefill
    _, short = step_with_arrival(b, tiny_engine, 7, 1)  # a decode alone: nothing to gain by pausing it
    drain(b)
    long = b.submit(prompt_token_ids(tiny_engine.tokenizer, 160), max_new=1)
    _, later = step_with_arrival(b, tiny_engine, 200, 1)  # more left than the chunked prefill: no pause
    assert b.pauses == 0 and long._fed == 16
    drain(b)
    assert decoding.done and short.done and later.done and long.done


def test_requests_over_one_shared_prefix_match_full_prefill(tiny_engine):
    root = prompt_token_ids(tiny_engine.tokenizer, 64)
    prefix = SharedPrefix.from_tensor(stack_cache(tiny_engine.prefill(root).cache))
    suffixes = [prompt_token_ids(tiny_engine.tokenizer, 64 + n)[64:] for n in (4, 11, 7)]
    b = Batcher(tiny_engine, max_batch_tokens=32, max_rows=4)
    reqs = [b.submit(s, shared=prefix, max_new=5) for s in suffixes]
    drain(b)
    for s, r in zip(suffixes, reqs, strict=True):
        assert r.result() == alone(tiny_engine, root + s, 5)
        assert cache_length(r.cache) == len(s) + 4  # its suffix and its outputs but the last: no root copy


def test_the_queue_never_exceeds_its_bound(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=16, max_rows=2, max_queue=3)
    reqs = [b.submit([1, 2, 3], max_new=2) for _ in range(3)]
    with pytest.raises(BatcherFull):
        b.submit([1, 2, 3])
    assert b.queue_length == 3 and b.peak_queue == 3
    b.step()
    assert b.queue_length == 3  # two run, one waits (max_rows)
    drain(b)
    assert all(r.done for r in reqs) and b.peak_rows <= 2
    b.submit([4, 5])  # room again


def test_the_loop_thread_serves_concurrent_callers(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=64)
    b.start()
    prompts = [prompt_token_ids(tiny_engine.tokenizer, n) for n in (10, 30, 50, 70)]
    got: dict[int, list[int]] = {}
    threads = [
        threading.Thread(target=lambda i=i: got.__setitem__(i, b.generate(prompts[i], max_new=4))) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    b.stop()
    assert got == {i: alone(tiny_engine, p, 4) for i, p in enumerate(prompts)}
    with pytest.raises(RuntimeError, match="stopped"):
        b.submit([1])


def test_calls_run_on_the_loop_thread_with_its_own_torch_threads(tiny_engine):
    import torch

    def where() -> tuple[str, int]:
        return threading.current_thread().name, torch.get_num_threads()

    b = Batcher(tiny_engine, threads=3)
    assert b.call(where)[0] == threading.current_thread().name  # no loop thread yet: inline
    b.start()
    try:
        assert b.call(where) == ("graphflow-engine-loop", 3)
        assert b.generate(prompt_token_ids(tiny_engine.tokenizer, 12), max_new=2)  # steps still run
        with pytest.raises(ZeroDivisionError):
            b.call(lambda: 1 / 0)
        assert b.call(lambda x: x + 1, 1) == 2  # an error does not stop the loop
    finally:
        b.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        b.call(where)


def test_bad_requests_and_settings_are_refused(tiny_engine):
    with pytest.raises(ValueError, match="max_batch_tokens > max_rows"):
        Batcher(tiny_engine, max_batch_tokens=4, max_rows=4)
    b = Batcher(tiny_engine)
    with pytest.raises(ValueError, match="at least one token"):
        b.submit([])
    with pytest.raises(ValueError, match="max_new"):
        b.submit([1], max_new=0)


def test_a_new_request_reserves_room_for_exactly_what_it_will_hold(tiny_engine):
    from graphflow.models.row_cache import RowCache

    b = Batcher(tiny_engine, max_batch_tokens=16, max_rows=2)
    prompt = prompt_token_ids(tiny_engine.tokenizer, 21)
    req = b.submit(prompt, max_new=6)
    drain(b)
    assert isinstance(req.cache, RowCache) and req.cache.capacity == 21 + 6 - 1
    assert cache_length(req.cache) == req.cache.capacity  # every token but the last generated one
    assert req.result() == alone(tiny_engine, prompt, 6)


def test_steps_run_the_mlp_and_head_over_the_rows_the_padding_says_and_give_the_same_tokens(tiny_engine):
    prompts = [prompt_token_ids(tiny_engine.tokenizer, n) for n in (11, 7, 19)]
    got, head_rows = {}, []
    hook = tiny_engine.model.lm_head.register_forward_hook(lambda m, args, y: head_rows.append(args[0].shape[-2]))
    try:
        for name, pad in (("unpadded", None), ("padded", GemmPadding((1, 4, 4, 4)))):
            b = Batcher(tiny_engine, max_batch_tokens=64, max_rows=4)
            b.padding = pad
            reqs = [b.submit(p, max_new=4) for p in prompts]
            head_rows.clear()
            drain(b)
            got[name] = ([r.result() for r in reqs], list(head_rows))
    finally:
        hook.remove()
    assert got["unpadded"][1] == [3, 3, 3, 3] and got["padded"][1] == [4, 4, 4, 4]  # 3 rows a step
    assert got["padded"][0] == got["unpadded"][0] == [alone(tiny_engine, p, 4) for p in prompts]


def test_the_padding_is_measured_on_the_loop_thread_once_it_runs(tiny_engine):
    b = Batcher(tiny_engine, max_batch_tokens=16, max_rows=4)
    b.start()
    try:
        pad = b.measure_padding()
        assert pad is b.padding and pad is not None and len(pad.to) == 16
        assert b.generate(prompt_token_ids(tiny_engine.tokenizer, 9), max_new=3) == alone(
            tiny_engine, prompt_token_ids(tiny_engine.tokenizer, 9), 3
        )
    finally:
        b.stop()
