"""Threads for the CPU backend: the kernels' tile loops run on all cores.

The tile loops (:mod:`opfuse.backends.cpu.tiling`) have independent iterations. With more
than one thread they become ``scf.parallel`` and upstream's ``async-parallel-for`` splits
each into blocks that MLIR's async runtime (``libmlir_async_runtime.so``, shipped with
the wheels: an LLVM thread pool of one worker per hardware thread) runs concurrently;
the calling thread waits for them. One thread: plain ``scf.for`` loops, no runtime.

OpenMP is not an option with these wheels: its lowering calls ``libomp``'s ``__kmpc_*``
entry points and no libomp ships with them (torch's bundled libgomp has only GOMP_*).

The thread count is a compile-time choice (``async-parallel-for{num-workers=N}`` splits a
loop into blocks for N workers): :func:`resolve_threads` reads it from the caller, else
:data:`opfuse.config.CPU_THREADS`, else every core this process may use.

The runtime library is loaded by :func:`opfuse.runtime.cpu.load_async_runtime` when a
program compiled for more than one thread is JIT-compiled. A bundle's portable CPU library
(:mod:`opfuse.backends.cpu.library`) is always single-threaded: it links nothing but libm.
"""

from __future__ import annotations

import os

from ...config import CPU_THREADS
from ...errors import OpfuseError


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None = None) -> int:
    """The thread count to compile for: ``threads`` if given, else ``OPFUSE_CPU_THREADS``,
    else :func:`usable_cores`; 0 means every usable core too.

    Raises:
        OpfuseError: a negative count, or an environment value that is not a whole number.
    """
    if threads is None:
        text = CPU_THREADS.get()
        if text is None:
            return usable_cores()
        try:
            threads = int(text)
        except ValueError:
            raise OpfuseError(f"{CPU_THREADS.name}={text!r}: expected a whole number of "
                              "threads (0 or unset: every usable core)") from None
        if threads < 0:
            raise OpfuseError(f"{CPU_THREADS.name}={text!r}: expected a whole number of "
                              "threads >= 0 (0 or unset: every usable core)")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise OpfuseError(f"threads must be a whole number >= 0 (0 or None: every usable "
                          f"core), got {threads!r}")
    return usable_cores() if threads == 0 else threads


def async_stages(threads: int) -> list[str]:
    """The passes that turn the parallel tile loops into tasks of the async runtime (none
    for one thread). ``min-task-size=1``: an iteration is a whole tile, never too small
    to be a task of its own."""
    if threads == 1:
        return []
    return [
        f"async-parallel-for{{async-dispatch=true num-workers={threads} min-task-size=1}}",
        "async-to-async-runtime",
        "async-runtime-ref-counting",
        "async-runtime-ref-counting-opt",
        "arith-expand",
        "convert-async-to-llvm",
    ]
