"""The lock that makes one Llama's public calls take turns (kvgguf/runtime/call_lock.py), without
a model: a second thread waits for a call and for a stream; a stream stepped from several
threads (a server's thread pool) does not deadlock; send() reaches the generator; a stream
closed, finished or dropped half-way gives the lock back."""

from __future__ import annotations

import gc
import threading

import pytest

from kvgguf.runtime.call_lock import CallLock, holding

WAIT_S = 5.0


def try_in_thread(lock: CallLock) -> threading.Event:
    """Starts a thread that takes the lock once; the event is set when it got it."""
    got = threading.Event()

    def run():
        with lock:
            got.set()

    threading.Thread(target=run, daemon=True).start()
    return got


def counting():
    n = 0
    while True:
        more = yield n
        n += 1 if more is None else more


def test_another_thread_waits_for_a_call_and_the_owner_reenters():
    lock = CallLock()
    with lock:
        with lock:  # a public call inside another (create_chat_completion -> create_completion)
            got = try_in_thread(lock)
            assert not got.wait(0.2)
    assert got.wait(WAIT_S)
    assert not lock.held


def test_a_stream_holds_the_lock_between_chunks_until_it_ends():
    lock = CallLock()
    stream = holding(lock, (i for i in range(3)))
    assert not lock.held, "an unstarted stream holds nothing"
    assert next(stream) == 0
    got = try_in_thread(lock)
    assert not got.wait(0.2)
    assert list(stream) == [1, 2]
    assert got.wait(WAIT_S)


def test_send_reaches_the_generator():
    lock = CallLock()
    stream = holding(lock, counting())
    assert next(stream) == 0
    assert stream.send(5) == 5
    assert next(stream) == 6
    stream.close()
    assert not lock.held


def test_a_stream_stepped_from_other_threads_does_not_deadlock():
    """A server's thread pool takes each chunk on whichever worker is free; the generator's own
    steps take the lock again (eval inside generate)."""
    lock = CallLock()

    def inner():
        for i in range(4):
            with lock:  # a nested call in the same step
                yield i

    stream = holding(lock, inner())
    got = []
    for _ in range(4):
        t = threading.Thread(target=lambda: got.append(next(stream)))
        t.start()
        t.join(WAIT_S)
        assert not t.is_alive(), "a step on another thread waited for the lock its own stream holds"
    assert got == [0, 1, 2, 3]
    stream.close()
    assert not lock.held


@pytest.mark.parametrize("how", ["close", "drop", "collect", "error"])
def test_a_stream_left_half_way_gives_the_lock_back(how):
    lock = CallLock()
    closed = []

    def inner():
        try:
            yield from range(10)
        finally:
            closed.append(lock.held)  # clean-up runs while the lock is still held

    stream = holding(lock, inner())
    next(stream)
    if how == "close":
        stream.close()
    elif how == "drop":
        del stream
    elif how == "collect":
        cycle = [stream]
        cycle.append(cycle)
        del stream, cycle
        gc.collect()
    else:
        with pytest.raises(KeyError):
            stream.throw(KeyError("the consumer's own error"))
    assert closed == [True]
    assert try_in_thread(lock).wait(WAIT_S)
    assert not lock.held


def test_an_error_in_the_stream_reaches_the_consumer_and_frees_the_lock():
    lock = CallLock()

    def failing():
        yield 1
        raise ValueError("Requested tokens (9000) exceed context window of 2048")

    stream = holding(lock, failing())
    assert next(stream) == 1
    with pytest.raises(ValueError, match="exceed context window"):
        next(stream)
    assert not lock.held


def test_release_without_acquire_is_an_error_not_a_negative_count():
    with pytest.raises(RuntimeError):
        CallLock().release()


def test_a_thread_calling_in_a_loop_does_not_starve_another():
    """Fair: a completion that asks while another thread saves again and again gets its turn
    after the save in progress."""
    lock = CallLock()
    stop, turns = threading.Event(), []

    def loop():
        while not stop.is_set():
            with lock:
                turns.append("save")

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    while not turns:
        pass
    got = try_in_thread(lock)
    assert got.wait(WAIT_S), "the other caller never got the lock"
    stop.set()
    t.join(WAIT_S)
