"""Free a threaded program's JIT code only once no worker of the async runtime can be in it.

A program compiled for more than one thread hands its tile loops to MLIR's async runtime
(``libmlir_async_runtime.so``: one process-wide LLVM thread pool). The calling thread
returns as soon as the last task has made its token available, but the worker that did
so is still inside the JIT code for a few more instructions (dropping references, ending
the coroutine, returning). Freeing the ExecutionEngine in that window unmaps the code
under the worker: a segfault in a thread Python knows nothing about. Creating, calling
and freeing a 1024x1024 threaded tanh program crashed the process within 33-400 rounds,
every time; with the engines kept alive, 1,500 rounds ran clean.

So :class:`opfuse.runtime.cpu.CpuProgram` hands its engine to :func:`retire` instead of
dropping it. :func:`quiesce` puts one task per worker on the pool (through the runtime's
own ``mlirAsyncRuntimeExecute``), each task being libc's ``pthread_barrier_wait`` on one
barrier that this thread waits on too: it opens once every worker sits in it, and a worker
runs one task at a time, so by then every task queued before has returned out of its JIT
code. The tasks are plain C (no Python, no GIL in the workers: nothing for them to wait
on while the interpreter exits). The runtime has no "wait for the pool" entry point of
its own (its ``__mlir_execution_engine_destroy`` deletes the pool outright: see
:func:`opfuse.runtime.cpu.load_async_runtime`).

An engine retired while a barrier is running on this thread (a garbage collection inside
:func:`retire`) or at interpreter exit waits in :data:`_retired` for the next barrier or
for the process to end: memory kept, never a crash.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from functools import lru_cache
from typing import Any

#: Bytes reserved for a ``pthread_barrier_t`` (32 on glibc x86-64 and aarch64).
_BARRIER_BYTES = 128

_retired: list[Any] = []  # engines waiting for a barrier (or the process's end)
_retired_lock = threading.Lock()  # appends from any thread; the barrier's holder trims
_barrier_lock = threading.Lock()  # one barrier at a time (not reentrant: see retire)
_exiting = False


@atexit.register
def _at_exit() -> None:
    # Past this point Python may be finalizing (ctypes half torn down): engines freed
    # from now on are kept until the process is gone.
    global _exiting
    _exiting = True


@lru_cache(maxsize=1)
def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    from .cpu import load_async_runtime  # loaded RTLD_GLOBAL once (cpu.py imports us)

    runtime = ctypes.CDLL(load_async_runtime())
    runtime.mlirAsyncRuntimeExecute.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    runtime.mlirAsyncRuntimeExecute.restype = None
    # (sic: upstream spells it without the second 'e')
    runtime.mlirAsyncRuntimGetNumWorkerThreads.restype = ctypes.c_int64
    libc = ctypes.CDLL(None)  # the process's libc: pthread_barrier_* (glibc >= 2.34 or libpthread)
    libc.pthread_barrier_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    libc.pthread_barrier_wait.argtypes = [ctypes.c_void_p]
    libc.pthread_barrier_destroy.argtypes = [ctypes.c_void_p]
    return runtime, libc


def worker_count() -> int:
    """The async runtime's worker threads (its pool's maximum concurrency)."""
    runtime, _ = _libraries()
    return int(runtime.mlirAsyncRuntimGetNumWorkerThreads())


def quiesce() -> None:
    """Return once every task put on the async runtime's pool before this call has
    returned (waiting for a worker as long as its current task runs).

    Not from a task of the pool itself: it would wait for its own worker.
    """
    runtime, libc = _libraries()
    parties = worker_count()
    barrier = ctypes.create_string_buffer(_BARRIER_BYTES)
    error = libc.pthread_barrier_init(barrier, None, parties + 1)
    if error:
        raise OSError(error, f"pthread_barrier_init: {os.strerror(error)}")
    # The task is the barrier wait itself: CoroResume is void(*)(void*), and the int
    # pthread_barrier_wait returns is left in a register the caller ignores.
    wait = ctypes.cast(libc.pthread_barrier_wait, ctypes.c_void_p)
    for _ in range(parties):
        runtime.mlirAsyncRuntimeExecute(ctypes.addressof(barrier), wait)
    libc.pthread_barrier_wait(barrier)  # ctypes lets go of the GIL while it waits
    # glibc's destroy waits until every waiter has left the barrier's memory
    libc.pthread_barrier_destroy(barrier)


def retire(engine: Any) -> None:
    """Drop ``engine`` (an ExecutionEngine whose code ran on the async runtime) once no
    worker can be inside its code; until then it is kept in :data:`_retired`."""
    with _retired_lock:
        _retired.append(engine)
    del engine
    if _exiting or not _barrier_lock.acquire(blocking=False):
        # A barrier is running: on another thread, or on this one (a garbage collection
        # in the loop below); that loop frees this engine on its next round.
        return
    try:
        while True:
            with _retired_lock:
                waiting = len(_retired)
            if not waiting:
                return
            quiesce()
            with _retired_lock:
                freed = _retired[:waiting]  # only appends happened meanwhile
                del _retired[:waiting]
            # Every task those engines' code put on the pool has returned (the barrier),
            # and none can start again (nothing can call them): their destructors run
            # here; one that retires another program meanwhile gets the next round.
            del freed
    finally:
        _barrier_lock.release()


def retired_count() -> int:
    """Engines still waiting to be freed."""
    with _retired_lock:
        return len(_retired)
