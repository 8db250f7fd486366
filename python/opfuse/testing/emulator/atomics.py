"""``memref.atomic_rmw``: the emulator's atomic read-modify-write (PTX ``atom`` / ``red``).

From the PTX ISA ("Parallel Synchronization and Communication Instructions: atom"): an
atomic operation loads the value at address ``a``, combines it with operand ``b`` and
stores the result at ``a`` in one indivisible step, returning the value it loaded
(``red`` is the same without the result). Operations by different threads on one address
happen one after another in an order the ISA leaves unspecified; each sees the result of
the ones before it. ``atom.add.f32`` rounds every addition to f32 (round to nearest even;
the ISA: "atom.add.f32 rounds to nearest even and flushes subnormal inputs and results to
sign-preserving zero" only with ``.ftz``, which opfuse never asks for).

The emulator runs every thread of a launch in lockstep, so the threads of one atomic
instruction are serialized here in the order of their flat thread index: the returned
values and the final memory are those of that order, one of the orders a GPU may take (a
float sum may differ from the GPU's in the last bits: compare with tolerances). Inactive
threads (masked off by control flow) do not access memory.

Global memory only: the emitters use atomics to combine partial results of several blocks
(a column sum inside a row kernel); a shared-memory atomic is refused rather than left
outside the race check.
"""

from __future__ import annotations

import numpy as np
from mlir import ir

from ...errors import OpfuseError
from .instructions import _BF16_BITS

#: atomic_rmw kind -> the combining function (old value, operand) -> new value.
_KINDS = {
    "addf": np.add,
    "addi": np.add,
    "mulf": np.multiply,
    "muli": np.multiply,
    "maximumf": np.maximum,
    "minimumf": np.minimum,
    "maxs": np.maximum,
    "mins": np.minimum,
    "andi": np.bitwise_and,
    "ori": np.bitwise_or,
    "assign": lambda old, x: x,
}


def kind_of(op: ir.Operation) -> str:
    """The ``kind`` of a ``memref.atomic_rmw`` (``addf``, ``maxs``, ...). The attribute is
    arith's ``AtomicRMWKind`` enum, printed as its number (``0 : i64``); the numbers are read
    from the bindings (one tiny op parsed per kind), not written down here."""
    number = ir.IntegerAttr(op.attributes["kind"]).value
    kind = _numbers(op.context).get(number)
    if kind is None:
        raise OpfuseError(f"emulator: memref.atomic_rmw kind {number} is not supported")
    return kind


_NUMBERS: dict[int, str] = {}


def _numbers(ctx: ir.Context) -> dict[int, str]:
    if not _NUMBERS:
        for k in _KINDS:
            ty = "f32" if k.endswith("f") else "i32"
            text = (f"func.func @f(%m: memref<1x{ty}>, %v: {ty}, %i: index) {{\n"
                    f"  %o = memref.atomic_rmw {k} %v, %m[%i] : ({ty}, memref<1x{ty}>) -> {ty}\n"
                    "  return\n}")
            module = ir.Module.parse(text, ctx)
            body = module.body.operations[0].regions[0].blocks[0]
            _NUMBERS[ir.IntegerAttr(body.operations[0].attributes["kind"]).value] = k
    return _NUMBERS


def atomic_rmw(emu, op: ir.Operation, env: dict, mask: np.ndarray, L) -> None:
    """``%old = memref.atomic_rmw kind %value, %mem[%i]`` for every active thread."""
    value, mem_v, *index = list(op.operands)
    kind = kind_of(op)
    where, ref = env[mem_v]
    if where != "mem":
        raise OpfuseError(f"emulator: {L.kernel}: memref.atomic_rmw on shared memory is not "
                          "supported (only global memory)")
    arr = ref
    if arr.dtype == _BF16_BITS:
        raise OpfuseError(f"emulator: {L.kernel}: memref.atomic_rmw on bf16 is not supported")
    if len(index) != 1:
        raise OpfuseError("emulator: memref.atomic_rmw on a memref of rank other than 1")
    idx = np.broadcast_to(np.asarray(env[index[0]]), (L.n,)).astype(np.int64)
    x = np.broadcast_to(np.asarray(env[value]), (L.n,)).astype(arr.dtype, copy=False)
    active = np.nonzero(mask)[0]
    if active.size and (idx[active].min() < 0 or idx[active].max() >= arr.shape[0]):
        raise OpfuseError(f"emulator: {L.kernel}: atomic out of bounds (index "
                          f"{int(idx[active].max())}, size {arr.shape[0]})")
    old = np.zeros(L.n, dtype=arr.dtype)
    combine = _KINDS[kind]
    pending = active
    # One round per thread on the busiest address: each round applies, for every address
    # still wanted, the request of the lowest-numbered thread that has not had its turn.
    while pending.size:
        addrs = idx[pending]
        _, first = np.unique(addrs, return_index=True)
        turn = pending[first]
        a = idx[turn]
        old[turn] = arr[a]
        arr[a] = combine(arr[a], x[turn]).astype(arr.dtype, copy=False)
        pending = np.delete(pending, first)
    env[op.results[0]] = old


HANDLERS = {"memref.atomic_rmw": atomic_rmw}

__all__ = ["HANDLERS", "atomic_rmw", "kind_of"]
