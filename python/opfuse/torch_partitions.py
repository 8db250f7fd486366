"""A partitioned PyTorch program: every partition opfuse supports compiled and fused, the ops
left eager run by PyTorch between them (``opfuse.frontends.torch.partition`` splits the
graph; this module compiles the partitions and runs the split graph).

``PartitionedProgram(program, **options)`` takes an exported program (after opfuse's
decompositions), compiles each partition with :func:`opfuse.compile` and swaps it into the
split graph as a :class:`CompiledPartition`; calling it runs the split graph on the
program's flat inputs (parameters, buffers, constants and user inputs in the order of its
graph signature). Its ``report`` lists every partition (its ATen ops, kernels before and
after fusion, the full fusion report) and every op left eager with the reason; a
:class:`FallbackWarning` names the eager ops once, when the program is compiled.

Tensors cross into a compiled partition as numpy arrays that share their memory
(float32/float16/int64 as they are, bfloat16 as its uint16 bit patterns, bool as int8 0/1:
the i8 booleans of the IR); tensors on another device are copied to the host and the
results back to that device. On the cuda backend, when the Executable offers
``run_device(inputs, outputs, *, stream)``, CUDA tensors are passed by pointer instead
(written against the cuda runtime's announced contract; not run here: no GPU).
"""

from __future__ import annotations

import operator
import warnings
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np
import torch

from . import api
from .errors import OpfuseError
from .frontends.torch.importer import ImportedGraph, _op_name, _where, import_graph_module
from .frontends.torch.partition import EagerOp, partition
from .driver.executable import Executable

# element types of the IR -> torch dtypes (the importer's i8 values are always booleans)
TORCH_DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i8": torch.bool,
    "i64": torch.int64,
    "i32": torch.int32,
}


#: Import partitions compiled for the CPU as for the GPU: results that are inputs or views
#: are made by torch, not written by a kernel (``import_graph_module``'s
#: ``views_in_torch``), so that the partitions' GPU programs can be built and emulated from
#: a CPU run (``bench/zoo_gpu.py``, the training tests). Off by default: on the CPU it costs
#: a Python-level op per view and call.
GPU_LAYOUT_ON_CPU = False


class FallbackWarning(UserWarning):
    """opfuse ran (part of) a model eagerly instead of compiled; the message says why."""


def warn(message: str) -> None:
    warnings.warn(f"opfuse: {message}", FallbackWarning, stacklevel=4)


class Program:
    """An imported graph's Executable, called with torch tensors (its inputs in order)."""

    def __init__(self, imported: ImportedGraph, executable: Executable):
        self.imported = imported
        self.executable = executable
        self.outputs = executable.signature.outputs
        shapes = imported.output_shapes or [tuple(s.shape) for s in self.outputs]
        replays = imported.result_views or [None] * len(self.outputs)
        # per returned result, what makes the graph's result of it (None: itself): the
        # view with the 1s it is returned without, then the views torch applies to it
        self._post = [_post(tuple(shape) if tuple(shape) != tuple(s.shape) else None, r)
                      for shape, s, r in zip(shapes, self.outputs, replays)]
        self._plain = not any(self._post)
        # results torch makes from the inputs (views of them), by position among all
        self.input_views = imported.input_views
        self.n_results = len(self.outputs) + len(self.input_views)
        #: (pointer call, input specs, output specs) once known; False: no fast path
        self._pointer_call: Any = None

    def run(self, tensors: Sequence[Any]) -> list[Any]:
        """The results, on the device of the first tensor."""
        device = tensors[0].device if tensors else torch.device("cpu")
        run_device = getattr(self.executable, "run_device", None)
        if run_device is not None and device.type == "cuda" and self.executable.backend == "cuda":
            return self._run_on_device(run_device, tensors, device)  # pragma: no cover - GPU
        fast = self._fast_path(tensors)
        if fast is not None:
            return fast
        results = self.executable(*(to_numpy(t) for t in tensors))
        results = results if isinstance(results, tuple) else (results,)
        return self.as_results(results, tensors)

    def _fast_path(self, tensors: Sequence[Any]) -> list[Any] | None:
        """The results, computed on the tensors' memory: the CPU program called on their
        data addresses and on fresh result tensors' (no numpy arrays, no conversions:
        40 of a small partition's 80 us per call went to them); None (the checked numpy
        path) unless every input is a contiguous CPU tensor of the signature's shape and
        dtype."""
        if self._pointer_call is None:
            call = self.executable.pointer_call()
            ins = [(tuple(s.shape), TORCH_DTYPES.get(s.element_type))
                   for s in self.executable.signature.inputs]
            outs = [(tuple(s.shape), TORCH_DTYPES.get(s.element_type)) for s in self.outputs]
            usable = call is not None and all(d is not None for _, d in ins + outs)
            self._pointer_call = (call, ins, outs) if usable else False
        if self._pointer_call is False:
            return None
        call, ins, outs = self._pointer_call
        if len(tensors) != len(ins):
            return None
        for t, (shape, dtype) in zip(tensors, ins):
            if (t.dtype is not dtype or t.device.type != "cpu" or t.shape != shape
                    or not t.is_contiguous()):
                return None
        results = [torch.empty(shape, dtype=dtype) for shape, dtype in outs]
        # the tensors stay referenced (here) until the call returns
        call([t.data_ptr() for t in tensors] + [r.data_ptr() for r in results])
        return self._viewed(results, tensors)

    def as_results(self, arrays: Sequence[np.ndarray], tensors: Sequence[Any]) -> list[Any]:
        """The graph's results from the function's (``arrays``, in its order) and the
        inputs ``tensors``: torch tensors on the inputs' device, viewed as the graph's,
        with the results torch makes from the inputs in their places. (The GPU program's
        results, from the emulator, go through this too.)"""
        device = tensors[0].device if tensors else torch.device("cpu")
        return self._viewed([to_torch(np.asarray(a), s.element_type, device)
                             for a, s in zip(arrays, self.outputs)], tensors)

    def _viewed(self, results: list[Any], tensors: Sequence[Any]) -> list[Any]:
        """Every result: the function's (viewed as the graph's), and in their places the
        ones torch makes from the inputs."""
        if not self._plain:
            results = [r if f is None else f(r) for r, f in zip(results, self._post)]
        if not self.input_views:
            return results
        returned = iter(results)
        return [self.input_views[k](tensors) if k in self.input_views else next(returned)
                for k in range(self.n_results)]

    def _run_on_device(self, run_device: Callable, tensors: Sequence[Any], device: Any) -> list:
        # pragma: no cover - needs a GPU and the cuda runtime's run_device
        inputs = [t.detach().contiguous() for t in tensors]
        outputs = [
            torch.empty(s.shape, dtype=TORCH_DTYPES[s.element_type], device=device)
            for s in self.outputs
        ]
        stream = torch.cuda.current_stream(device).cuda_stream
        run_device([t.data_ptr() for t in inputs], [t.data_ptr() for t in outputs],
                   stream=stream)
        return self._viewed(outputs, tensors)


def _post(shape: tuple[int, ...] | None, replay: Callable[[Any], Any] | None
          ) -> Callable[[Any], Any] | None:
    """``view(shape)`` then ``replay``, either one absent (None when both are)."""
    if shape is None:
        return replay
    if replay is None:
        return lambda t: t.view(shape)
    return lambda t: replay(t.view(shape))


class CompiledPartition(torch.nn.Module):
    """One partition in the split graph: the compiled program, and the partition's own
    ATen submodule, which runs instead (with a warning, and from then on) if the program
    fails at call time (the CPU program is JIT-compiled on the first call)."""

    def __init__(self, name: str, submodule: Any, program: Program):
        super().__init__()
        self.name = name
        self.eager = submodule
        self.program = program
        self.failed = False  # the program failed once: the submodule runs from then on

    def forward(self, *tensors: Any) -> tuple:
        if not self.failed:
            try:
                return tuple(self.program.run(tensors))
            except Exception as e:  # noqa: BLE001  (never fail the model: run it eagerly)
                warn(f"partition {self.name} runs eagerly, not compiled: {reason(e)}")
                self.failed = True
        return self.eager(*tensors)


def _one_partition(gm: Any, partitions: list[CompiledPartition]
                   ) -> Callable[[Sequence[Any]], list[Any]] | None:
    """The split graph as one call, where it is nothing but one compiled partition (its
    inputs graph inputs, the graph's outputs its results or inputs): the partition called
    on the inputs it takes, without the split module's Python (a training step of the
    MLP calls two such graphs; each layer of calls costs microseconds). None otherwise."""
    if len(partitions) != 1:
        return None
    nodes = list(gm.graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_module"]
    (output,) = [n for n in nodes if n.op == "output"]
    if len(calls) != 1 or calls[0].kwargs or not all(a in inputs for a in calls[0].args):
        return None
    call = calls[0]
    if getattr(gm, str(call.target), None) is not partitions[0]:
        return None
    items = {}
    for n in nodes:
        if n.op in ("placeholder", "call_module", "output"):
            continue
        if not (n.op == "call_function" and n.target is operator.getitem
                and n.args[0] is call and isinstance(n.args[1], int)):
            return None
        items[n] = n.args[1]
    returned = output.args[0]
    if not isinstance(returned, (tuple, list)):
        return None
    where = []  # per output: ("result", k) or ("input", j)
    for r in returned:
        if r in items:
            where.append((True, items[r]))
        elif r in inputs:
            where.append((False, inputs.index(r)))
        else:
            return None
    takes = [inputs.index(a) for a in call.args]
    forward = partitions[0].forward

    def direct(flat: Sequence[Any]) -> list[Any]:
        results = forward(*[flat[j] for j in takes])
        return [results[k] if is_result else flat[k] for is_result, k in where]

    return direct


class PartitionedProgram:
    """An exported program, split and compiled (see the module docstring).

    Args:
        program: An ``ExportedProgram`` after ``decomposition_table()`` (its graph module
            is split in place).
        name: Prefix of the compiled functions' names.
        strict: Raise a partition's compile error instead of leaving its ops eager.
        **options: Passed to :func:`opfuse.compile` (``backend``, ``target``, ...).

    Attributes:
        partitions: The compiled partitions, in graph order.
        eager: The ops left eager (:class:`EagerOp`), in graph order.
    """

    def __init__(self, program: Any, *, name: str = "forward", strict: bool = False,
                 **options: Any):
        self.signature = program.graph_signature
        views_in_torch = GPU_LAYOUT_ON_CPU or api.resolve_backend(
            options.get("backend", "auto")) == "cuda"
        split = partition(program)
        self.gm = split.gm
        self.partitions: list[CompiledPartition] = []
        self.eager: list[EagerOp] = list(split.eager)
        for sub_name, sub in split.partitions:
            try:
                imported = import_graph_module(sub, name=f"{name}_{sub_name}",
                                               views_in_torch=views_in_torch)
                executable = api.compile(imported.graph, **options)
            except OpfuseError as e:
                if strict:
                    raise
                self.eager += _partition_refused(sub, e)
                continue
            compiled = CompiledPartition(sub_name, sub, Program(imported, executable))
            setattr(self.gm, sub_name, compiled)
            self.partitions.append(compiled)
        self.placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self._direct = _one_partition(self.gm, self.partitions)
        if self.eager:
            warn(eager_message(self.eager))

    def __call__(self, flat_inputs: Sequence[Any]) -> list[Any]:
        """The program's flat outputs for its flat inputs."""
        if self._direct is not None:
            return self._direct(flat_inputs)
        return list(self.gm(*flat_inputs))

    def check(self, flat_inputs: Sequence[Any], names: Sequence[str]) -> None:
        """Every input has the shape and dtype compiled for (static shapes)."""
        for name, node, t in zip(names, self.placeholders, flat_inputs):
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):  # a constant the program is specialized on
                continue
            want = (tuple(val.shape), val.dtype)
            if (tuple(t.shape), t.dtype) != want:
                raise OpfuseError(
                    f"{name}: compiled for {want[1]} {want[0]}, got {t.dtype} "
                    f"{tuple(t.shape)}; compile again for new shapes or dtypes"
                )

    @property
    def report(self) -> dict[str, Any]:
        """Totals over the compiled partitions, each partition, and the ops left eager.

        ``totals`` sums the partitions' own (``before``/``after``: kernels, bytes, flops);
        ``eager_kernels`` counts the ops left eager (each at least one kernel of PyTorch's).
        """
        keys = ("kernels", "bytes", "flops")
        totals = {side: {k: 0 for k in keys} for side in ("before", "after")}
        rows = []
        for p in self.partitions:
            rep = p.program.executable.report
            for side in totals:
                for k in keys:
                    totals[side][k] += rep["totals"][side].get(k, 0)
            rows.append({
                "name": p.name,
                "ops": dict(p.program.imported.aten_ops),
                "inputs": len(p.program.imported.inputs),
                "eager_at_run_time": p.failed,
                "kernels": {s: rep["totals"][s]["kernels"] for s in ("before", "after")},
                "report": rep,
            })
        totals["launches_saved"] = totals["before"]["kernels"] - totals["after"]["kernels"]
        totals["bytes_saved"] = totals["before"]["bytes"] - totals["after"]["bytes"]
        return {
            "totals": totals,
            "partitions": rows,
            "eager": [e.to_json() for e in self.eager],
            "eager_kernels": len(self.eager),
        }


def _partition_refused(sub: Any, e: OpfuseError) -> list[EagerOp]:
    """The compute ops of a partition that did not compile, left eager with its error."""
    return [
        EagerOp(_op_name(n.target), n.name, f"its partition did not compile: {reason(e)}",
                _where(n))
        for n in sub.graph.nodes
        if n.op == "call_function" and _op_name(n.target) != "getitem"
    ]


def eager_message(eager: Sequence[EagerOp]) -> str:
    """One line naming the ops left eager (each op once, with its first reason)."""
    first: dict[str, EagerOp] = {}
    for e in eager:
        first.setdefault(e.op, e)
    counts = Counter(e.op for e in eager)
    listed = "; ".join(
        f"{op}{f' (x{counts[op]})' if counts[op] > 1 else ''}: {e.reason} (at {e.where})"
        for op, e in first.items()
    )
    return (f"{len(eager)} op(s) left eager, run by PyTorch between the compiled partitions: "
            f"{listed}")


def reason(e: BaseException) -> str:
    if isinstance(e, OpfuseError):
        return str(e)
    return f"internal error: {type(e).__name__}: {e}"


def to_numpy(t: Any) -> np.ndarray:
    """A numpy view of ``t``'s data (host copy only for other devices); bf16 as uint16 bits,
    bool as int8."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.bool:
        return t.numpy().view(np.int8)
    return t.numpy()


def to_torch(a: np.ndarray, element_type: str, device: Any) -> Any:
    """A tensor sharing ``a``'s memory (each call's results are fresh arrays)."""
    if element_type == "bf16":
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif element_type == "i8":
        t = torch.from_numpy(a).view(torch.bool)
    else:
        t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device)
