"""One public call at a time on a Llama: a lock owned by the call, not by a thread.

A completion is many llama_decode batches plus sampling, and llama.cpp's context holds one
sequence of logits: two threads interleaving their batches on one context abort the process
(`GGML_ASSERT(logits != nullptr)`). So every public call that touches the context holds this
lock from start to end, and a second thread waits.

Streaming calls are generators, and a server may step one generator from several threads (an
ASGI server's thread pool takes the next chunk on whichever worker is free). A thread-owned
lock would deadlock there, so the lock belongs to the call: `holding` takes it at the
generator's first step, lends it to whichever thread steps it (calls nested in that step, and
the consumer's own calls between chunks, pass through), and gives it back when the generator
finishes, is closed, or is garbage collected half-way.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Generator, Iterator, Optional, TypeVar

T = TypeVar("T")


class CallLock:
    """Reentrant for its owner thread; the owner changes when a held generator is stepped by
    another thread (adopt). Fair: calls from other threads get it in the order they asked, so a
    thread that calls in a loop (saving a session again and again) cannot starve a completion."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: Optional[int] = None
        self._holds = 0
        self._next_ticket = 0  # tickets handed to callers, in arrival order
        self._serving = 0  # the ticket whose turn is next

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._holds and self._owner == me:  # a call inside the owner's own call
                self._holds += 1
                return
            ticket = self._next_ticket
            self._next_ticket += 1
            while self._holds or self._serving != ticket:
                self._cond.wait()
            self._serving += 1
            self._owner = me
            self._holds = 1

    def release(self) -> None:
        with self._cond:
            if self._holds <= 0:
                raise RuntimeError("CallLock released more often than acquired")
            self._holds -= 1
            if not self._holds:
                self._owner = None
                self._cond.notify_all()

    def adopt(self, unless_nested: bool = False) -> None:
        """The calling thread now drives the call that holds the lock (a generator's next step).
        unless_nested: not while the owner is inside another call of its own (a generator
        finalized by the garbage collector on some other thread must not take the lock from it)."""
        with self._cond:
            if not (unless_nested and self._holds > 1):
                self._owner = threading.get_ident()

    def __enter__(self) -> "CallLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @property
    def held(self) -> bool:
        return self._holds > 0


def holding(lock: CallLock, gen: Generator[T, object, object]) -> Generator[T, object, object]:
    """gen, holding lock from its first step until it ends, is closed or is collected; send()
    and throw() reach gen as they would without the wrapper (llama-cpp-python's generate takes
    tokens through send)."""
    lock.acquire()
    try:
        sent: object = None
        thrown: Optional[BaseException] = None
        while True:
            lock.adopt()
            try:
                item = gen.throw(thrown) if thrown is not None else gen.send(sent)
            except StopIteration as stop:
                return stop.value
            sent, thrown = None, None
            try:
                sent = yield item
            except GeneratorExit:
                raise
            except BaseException as e:  # thrown in by the consumer: gen decides what it means
                thrown = e
    finally:
        try:
            lock.adopt(unless_nested=True)
            gen.close()  # gen's own clean-up runs while the lock is still held
        finally:
            lock.release()


# Decorators for kvgguf.Llama's methods, written where each method is defined. The object has
# _calls (a CallLock), _kv_lock (held around each batch; close() takes it) and _check_open(name),
# which raises once the Llama is closed: llama.cpp's model and context are freed then, and calling
# into them would crash the process.


def open_only(method: Callable) -> Callable:
    """Refuses the call on a closed Llama (a method that takes no lock: tokenize, n_vocab, ...)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        self._check_open(method.__name__)
        return method(self, *args, **kwargs)

    return run


def one_call(method: Callable) -> Callable:
    """Runs the method as one call: other threads' calls wait until it returns, or, where it
    returns a generator (a stream), until the generator ends or is closed."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._calls:
            self._check_open(method.__name__)
            out = method(self, *args, **kwargs)
        return holding(self._calls, out) if isinstance(out, Iterator) else out

    return run


def serialized(method: Callable) -> Callable:
    """Runs the method as one call that changes or reads the cache: close() from another thread
    waits for it too (the _kv_lock)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._calls, self._kv_lock:
            self._check_open(method.__name__)
            return method(self, *args, **kwargs)

    return run
