"""Which arguments of a public function a program would write into, and so must copy.

linalg on tensors is destination-passing: an op's result is written into the buffer of
its ``outs`` operand. Where that operand is (a view of) an argument of a function the
caller invokes with its own arrays (``linalg.matmul outs(%c)``, a reduction into an
argument, a kernel call that does either), the program must copy the argument first: the
caller's data is read-only (the CPU backend tells bufferization so: see
``opfuse.backends.cpu.lower.protect_arguments``). A copy is needed only when the written buffer's
old contents are read too (a matmul's accumulator, a generic whose body reads ``%out``);
an ``outs`` operand that is only overwritten gets a fresh buffer instead.

This module predicts those copies from the tensor IR, the way one-shot bufferization
decides them, so the report can count their bytes before anything is lowered. The GPU
backend needs none: its kernels read ``outs`` arguments and write fresh result buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from .opinfo import describe_all, tensor_bytes

#: Ops whose result is a view of their first operand (bufferization aliases them).
_VIEWS = frozenset({
    "tensor.expand_shape", "tensor.collapse_shape", "tensor.extract_slice", "tensor.cast",
    "tensor.reshape",
})


@dataclass(frozen=True)
class InputCopy:
    """One argument the program copies before writing into it.

    Attributes:
        function: the public function whose argument it is.
        argument: the argument's number.
        op: the op that writes into it (``linalg.matmul``, ``func.call @fusion_0_output``).
        bytes: bytes the copy moves (read + write of the copied tensor).
    """

    function: str
    argument: int
    op: str
    bytes: int

    def to_json(self) -> dict:
        return {"function": self.function, "argument": self.argument, "op": self.op,
                "bytes": self.bytes}


def input_copies(module: ir.Module) -> list[InputCopy]:
    """The copies of caller-owned arguments ``module``'s public functions need."""
    funcs = _functions(module)
    effects: dict[str, list[tuple[bool, bool]]] = {}
    copies: list[InputCopy] = []
    for name, fn in funcs.items():
        if _is_private(fn):
            continue
        for arg in fn.regions[0].blocks[0].arguments:
            for user, value in _writers(arg, funcs, effects):
                copies.append(InputCopy(name, arg.arg_number, _describe(user),
                                        2 * tensor_bytes(value.type)))
    return copies


def _functions(module: ir.Module) -> dict[str, ir.Operation]:
    out = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and op.regions[0].blocks:
            out[ir.StringAttr(op.attributes["sym_name"]).value] = op
    return out


def _is_private(fn: ir.Operation) -> bool:
    return ("sym_visibility" in fn.attributes
            and ir.StringAttr(fn.attributes["sym_visibility"]).value == "private")


def _describe(op: ir.Operation) -> str:
    if op.name == "func.call":
        return f"func.call @{ir.FlatSymbolRefAttr(op.attributes['callee']).value}"
    return op.name


def _uses(value: ir.Value):
    """(user op, operand number) of ``value`` and of every view of it."""
    todo = [value]
    while todo:
        v = todo.pop()
        for use in v.uses:
            user = use.owner
            user = user.operation if hasattr(user, "operation") else user
            if user.name in _VIEWS and use.operand_number == 0:
                todo.append(user.results[0])
                continue
            yield user, use.operand_number, v


def _writers(arg: ir.Value, funcs, effects) -> list[tuple[ir.Operation, ir.Value]]:
    """The uses of ``arg`` that write its buffer in place after reading it: each needs a
    copy of the operand when the argument is not writable."""
    out = []
    for user, index, v in _uses(arg):
        reads, writes = _effect(user, index, funcs, effects)
        if reads and writes:
            out.append((user, v))
    return out


def _effect(op: ir.Operation, index: int, funcs, effects) -> tuple[bool, bool]:
    """(reads, writes in place) of operand ``index`` of ``op``."""
    name = op.name
    if name == "func.return":
        return False, False
    if name == "func.call":
        callee = funcs.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
        if callee is None:
            return True, False
        return _arg_effects(callee, funcs, effects)[index]
    if name == "tensor.insert_slice":
        return True, index == 1  # the destination keeps what the slice does not cover
    if name.startswith("linalg.") and len(op.regions) > 0:
        n_in = len(op.operands) - len(op.results)
        if index < n_in:
            return True, False
        (info,) = describe_all(op.parent.operation, [op])
        used = info.payload.used_outputs if info.payload is not None else [True] * len(op.results)
        return used[index - n_in], True
    return True, False


def _arg_effects(fn: ir.Operation, funcs, effects) -> list[tuple[bool, bool]]:
    """Per argument of ``fn``: (read anywhere, written in place anywhere), memoized; a
    recursive call counts as reading and writing (the contract refuses recursion)."""
    name = ir.StringAttr(fn.attributes["sym_name"]).value
    if name in effects:
        return effects[name]
    args = fn.regions[0].blocks[0].arguments
    effects[name] = [(True, True)] * len(args)
    result = []
    for arg in args:
        reads = writes = False
        for user, index, _ in _uses(arg):
            r, w = _effect(user, index, funcs, effects)
            reads, writes = reads or r, writes or w
        result.append((reads, writes))
    effects[name] = result
    return result
