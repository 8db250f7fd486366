"""PyTorch models on opfuse: ``opfuse.torch.compile`` and ``torch.compile(backend="opfuse")``.

Both go through the torch importer (:mod:`opfuse.frontends.torch`) and
:func:`opfuse.compile`, then call the :class:`~opfuse.runtime.executable.Executable` with
the tensors' data:

* **CPU backend** (every machine): tensors cross as numpy arrays that share their memory
  (float32/float16 as they are, bfloat16 as its uint16 bit patterns, bool as int8 0/1:
  the i8 booleans of the IR), so a call copies
  nothing but the results' wrapping; tensors on another device are copied to the host and
  the results back to that device.
* **cuda backend**: when the Executable offers ``run_device(inputs, outputs, *, stream)``
  (device pointers of contiguous buffers, in signature order, launched on ``stream``), CUDA
  tensors are passed by pointer and the results are allocated on their device, so the
  kernels work on the tensors' own memory. Without that entry point the host path above is
  used. (Written against the cuda runtime's announced contract; not run here: no GPU.)

Parameters are read at **every call** (by their qualified names on the model, so
in-place updates, ``load_state_dict`` and re-assigned parameters are all seen); reading
one costs an attribute lookup and a zero-copy numpy view.

opfuse computes the forward pass only. A call while autograd is recording (grad mode on
and an input or parameter that requires grad) runs the model eagerly instead, with a
:class:`FallbackWarning`; call compiled models under ``torch.no_grad()`` or
``torch.inference_mode()``.

The Dynamo backend never fails the user's model: a graph that does not import or compile
(an unsupported op, a dynamic shape, an internal error) runs eagerly, with a
:class:`FallbackWarning` that names the reason (for an op, ``aten.cumsum.default``).
It is registered under the name ``opfuse`` through the ``torch_dynamo_backends`` entry
point; :func:`register` does the same in-process where the package is not installed.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch.utils import _pytree as pytree
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "opfuse.torch needs PyTorch: pip install 'opfuse[torch]' (torch==2.13.0)"
    ) from e

from . import api
from .errors import OpfuseError
from .frontends.torch import ImportedGraph, import_fx, import_module
from .runtime.executable import Executable

__all__ = ["CompiledModule", "FallbackWarning", "compile", "opfuse_backend", "register"]

#: The name ``torch.compile(backend=...)`` knows opfuse by.
BACKEND_NAME = "opfuse"

# element types of the IR -> torch dtypes (the importer's i8 values are always booleans)
_TORCH_DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i8": torch.bool,
    "i64": torch.int64,
}


class FallbackWarning(UserWarning):
    """opfuse ran (part of) a model eagerly instead of compiled; the message says why."""


# --------------------------------------------------------------------------- public API


def compile(  # noqa: A001  (opfuse.torch.compile mirrors torch.compile)
    model: Any,
    example_inputs: Any,
    *,
    target: str = "sm_90",
    backend: str = "auto",
    **options: Any,
) -> "CompiledModule":
    """Compile ``model`` for the shapes and dtypes of ``example_inputs``.

    Args:
        model: A ``torch.nn.Module`` in eval mode (training-mode dropout is unsupported).
        example_inputs: A tensor or a sequence of tensors (the positional arguments).
        target: The GPU the cost model plans for (``sm_80``, ``sm_90``).
        backend: ``auto`` (cuda when a GPU runtime is usable, else cpu), ``cpu`` or ``cuda``.
        **options: Passed to :func:`opfuse.compile` (``fusion=False``, ``pipeline=...``,
            pass options such as ``delta=0.2``).

    Returns:
        A callable taking tensors of the example inputs' shapes and dtypes and returning
        the model's output structure with torch tensors in it.

    Raises:
        OpfuseError: the model does not import (:class:`UnsupportedOpError` names the op
            and where the model calls it) or does not compile.
    """
    with _no_mha_fastpath(), _quiet_export():
        imported = import_module(model, example_inputs)
    executable = api.compile(imported.graph, backend=backend, target=target, **options)
    return CompiledModule(model, imported, executable)


class CompiledModule:
    """A model compiled by :func:`compile`; call it like the model.

    Attributes:
        model: The model (its parameters are read at every call).
        imported: The imported graph (its ``inputs`` list the function arguments).
        executable: The compiled program; ``executable.report`` holds the fusion report.
    """

    def __init__(self, model: Any, imported: ImportedGraph, executable: Executable):
        self.model = model
        self.imported = imported
        self.executable = executable
        self._program = _Program(imported, executable)
        self._state = [_state_getter(model, imported, i) for i in range(len(imported.params))]

    @property
    def report(self) -> dict:
        """The fusion report (``report["totals"]["before"/"after"]["kernels"]``, ledger)."""
        return self.executable.report

    def __call__(self, *args: Any) -> Any:
        n = len(self.imported.user_inputs)
        if len(args) != n or not all(isinstance(a, torch.Tensor) for a in args):
            got = ", ".join(type(a).__name__ for a in args) or "nothing"
            raise OpfuseError(f"the compiled model takes {n} tensor(s), got {got}")
        tensors = [*args, *(get() for get in self._state)]
        if _autograd_recording(tensors):
            _warn(_AUTOGRAD_REASON)
            return self.model(*args)
        self._program.check(tensors)
        return self._program.unflatten(self._program.run(tensors))

    def __repr__(self) -> str:
        totals = self.report.get("totals", {}) if isinstance(self.report, dict) else {}
        kernels = "/".join(str(totals.get(k, {}).get("kernels", "?")) for k in ("before", "after"))
        return (f"CompiledModule({type(self.model).__name__}, backend="
                f"{self.executable.backend!r}, kernels before/after={kernels})")


def opfuse_backend(
    gm: Any, example_inputs: Sequence[Any], *, options: dict | None = None, mode: str | None = None
) -> Callable:
    """The ``torch.compile`` backend: compile Dynamo's FX graph, or run it eagerly.

    ``torch.compile(model, backend="opfuse", options={"backend": "cpu", "delta": 0.2})``
    passes ``options`` here: ``target``, ``backend`` and the options of
    :func:`opfuse.compile`. ``mode`` is accepted and ignored.

    Returns:
        A function of the graph's inputs returning its outputs; ``gm.forward`` itself (with
        a :class:`FallbackWarning`) when the graph does not import or compile.
    """
    del mode  # opfuse has one mode
    opts = dict(options or {})
    try:
        with _quiet_export():
            imported = import_fx(_decompose_fastpath(gm), example_inputs)
        executable = api.compile(imported.graph, **opts)
    except Exception as e:  # noqa: BLE001  (never fail the user's model: run it eagerly)
        _warn(_reason(e))
        return gm.forward
    return _DynamoGraph(gm, _Program(imported, executable))


def register(name: str = BACKEND_NAME) -> None:
    """Make ``torch.compile(backend=name)`` find :func:`opfuse_backend`.

    Not needed once opfuse is installed with its ``torch_dynamo_backends`` entry point;
    then (and on a second call) this does nothing.
    """
    from torch._dynamo import list_backends, register_backend

    if name not in list_backends(exclude_tags=()):
        register_backend(compiler_fn=opfuse_backend, name=name)


# --------------------------------------------------------------------------- calls


class _Program:
    """An imported graph's Executable, called with torch tensors (user inputs, then params)."""

    def __init__(self, imported: ImportedGraph, executable: Executable):
        self.imported = imported
        self.executable = executable
        self.outputs = executable.signature.outputs
        self.names = [
            f"input {k}" if i.kind == "user" else f"{i.kind} {i.target!r}"
            for k, i in enumerate(imported.inputs)
        ]

    def check(self, tensors: Sequence[Any]) -> None:
        """Every tensor has the shape and dtype compiled for (static shapes)."""
        for name, spec, t in zip(self.names, self.imported.inputs, tensors):
            want = (spec.shape, _TORCH_DTYPES[spec.dtype])
            if (tuple(t.shape), t.dtype) != want:
                raise OpfuseError(
                    f"{name}: compiled for {want[1]} {want[0]}, got {t.dtype} "
                    f"{tuple(t.shape)}; compile again for new shapes or dtypes"
                )

    def run(self, tensors: Sequence[Any]) -> list[Any]:
        """The results, on the device of the first tensor."""
        device = tensors[0].device if tensors else torch.device("cpu")
        run_device = getattr(self.executable, "run_device", None)
        if run_device is not None and device.type == "cuda" and self.executable.backend == "cuda":
            return self._run_on_device(run_device, tensors, device)  # pragma: no cover - GPU
        results = self.executable(*(_to_numpy(t) for t in tensors))
        results = results if isinstance(results, tuple) else (results,)
        return [_to_torch(a, s.element_type, device) for a, s in zip(results, self.outputs)]

    def _run_on_device(self, run_device: Callable, tensors: Sequence[Any], device: Any) -> list:
        # pragma: no cover - needs a GPU and the cuda runtime's run_device
        inputs = [t.detach().contiguous() for t in tensors]
        outputs = [
            torch.empty(s.shape, dtype=_TORCH_DTYPES[s.element_type], device=device)
            for s in self.outputs
        ]
        stream = torch.cuda.current_stream(device).cuda_stream
        run_device([t.data_ptr() for t in inputs], [t.data_ptr() for t in outputs],
                   stream=stream)
        return outputs

    def unflatten(self, results: list[Any]) -> Any:
        """The model's output structure around ``results``."""
        if self.imported.out_spec is None:
            return results[0] if len(results) == 1 else tuple(results)
        return pytree.tree_unflatten(results, self.imported.out_spec)


class _DynamoGraph:
    """What the backend returns for a compiled graph: Dynamo calls it with the graph's inputs.

    An error at call time (the CPU program is JIT-compiled on the first call) or an
    autograd-recording call runs ``gm.forward`` instead, with a warning; after an error the
    graph stays eager.
    """

    def __init__(self, gm: Any, program: _Program):
        self.gm = gm
        self.program = program
        self.executable = program.executable

    def __call__(self, *args: Any) -> Any:
        if self.program is None:
            return self.gm.forward(*args)
        if _autograd_recording(args):
            _warn(_AUTOGRAD_REASON)
            return self.gm.forward(*args)
        try:  # the graph's own tensor constants (torch.tensor(2.0)) follow Dynamo's inputs
            results = self.program.run([*args, *self.program.imported.params])
        except Exception as e:  # noqa: BLE001  (e.g. the first call's JIT failed: run eagerly)
            _warn(_reason(e))
            self.program = None
            return self.gm.forward(*args)
        return self.program.unflatten(results)


_AUTOGRAD_REASON = (
    "autograd is recording (grad mode is on and an input or parameter requires grad) and "
    "opfuse computes the forward pass only; call the model under torch.no_grad() or "
    "torch.inference_mode()"
)


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Silences torch.export's own deprecation noise (it deep-copies a ``LeafSpec``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        yield


def _autograd_recording(tensors: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


def _reason(e: BaseException) -> str:
    if isinstance(e, OpfuseError):
        return str(e)
    return f"internal error: {type(e).__name__}: {e}"


def _warn(reason: str) -> None:
    warnings.warn(f"opfuse: running eagerly, not compiled: {reason}", FallbackWarning,
                  stacklevel=3)


def _state_getter(model: Any, imported: ImportedGraph, k: int) -> Callable[[], Any]:
    """Reads parameter/buffer ``k`` from the model by name, so the current one is used."""
    spec = imported.inputs[len(imported.user_inputs) + k]
    if spec.kind in ("parameter", "buffer") and isinstance(model, torch.nn.Module):
        owner_path, _, attr = spec.target.rpartition(".")
        try:
            owner = model.get_submodule(owner_path)
            getattr(owner, attr)
        except AttributeError:
            pass  # a name export made up: keep the tensor it handed us
        else:
            return lambda: getattr(owner, attr)
    tensor = imported.params[k]
    return lambda: tensor


def _to_numpy(t: Any) -> np.ndarray:
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


def _to_torch(a: np.ndarray, element_type: str, device: Any) -> Any:
    """A tensor sharing ``a``'s memory (each call's results are fresh arrays)."""
    if element_type == "bf16":
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif element_type == "i8":
        t = torch.from_numpy(a).view(torch.bool)
    else:
        t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device)


# --------------------------------------------------------------------------- fast paths


class _no_mha_fastpath:
    """Export the slow (plain-op) path of nn.MultiheadAttention/TransformerEncoderLayer.

    Under ``torch.no_grad()`` those modules call fused native kernels
    (``aten._native_multi_head_attention``, ``aten._transformer_encoder_layer_fwd``) that
    the importer has no rule for; the documented switch turns the fast path off while the
    model is traced and is restored afterwards.
    """

    def __enter__(self) -> None:
        self._was = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)

    def __exit__(self, *exc: Any) -> None:
        torch.backends.mha.set_fastpath_enabled(self._was)


def _native_keep(mask: Any, mask_type: Any, b: int) -> Any:
    """The native kernels' ``mask`` as SDPA's boolean one (True: attend), broadcastable to
    the (batch, heads, queries, keys) scores. The kernels read any mask as a boolean, true
    (nonzero) where masked: type 0 is (queries, keys), 1 a (batch, keys) padding mask,
    2 the merged (batch, heads, queries, keys) one."""
    keep = mask.logical_not()
    return keep.view(b, 1, 1, -1) if mask_type == 1 else keep


def _native_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                mask_type=None):
    """``torch._native_multi_head_attention`` in plain ops (batch-first)."""
    b, t, _ = query.shape
    keep = None if mask is None else _native_keep(mask, mask_type, b)
    head_dim = embed_dim // num_head
    biases = qkv_bias.chunk(3) if qkv_bias is not None else (None,) * 3

    def heads(x: Any, w: Any, bias: Any) -> Any:
        return F.linear(x, w, bias).reshape(b, -1, num_head, head_dim).transpose(1, 2)

    q, k, v = (heads(x, w, bias) for x, w, bias in
               zip((query, key, value), qkv_weight.chunk(3), biases))
    weights = None
    if need_weights:
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        if keep is not None:
            scores = torch.where(keep, scores, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        o = weights @ v
        weights = weights.mean(dim=1) if average_attn_weights else weights
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    return F.linear(o.transpose(1, 2).reshape(b, t, embed_dim), proj_weight, proj_bias), weights


def _encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                       use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                       norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
                       mask=None, mask_type=None):
    """``torch._transformer_encoder_layer_fwd`` in plain ops (the C++ kernel's order)."""

    def norm(x: Any, w: Any, bias: Any) -> Any:
        return F.layer_norm(x, (embed_dim,), w, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _native_mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                    proj_bias, mask, need_weights=False, mask_type=mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)
    x = x + h
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


_FASTPATH = {
    getattr(torch, "_native_multi_head_attention", None): _native_mha,
    getattr(torch, "_transformer_encoder_layer_fwd", None): _encoder_layer_fwd,
}
_FASTPATH.pop(None, None)


def _decompose_fastpath(gm: Any) -> Any:
    """``gm`` with the fused inference kernels Dynamo captured replaced by plain ops.

    Dynamo traces the modules' Python under the caller's grad mode, so a ``no_grad`` call
    captures the fast-path ops themselves (with their masks: a causal ``src_mask``, a
    padding mask). ``gm`` is not changed: its eager fallback stays torch's own kernel.
    """
    def plain(node: Any) -> Callable | None:
        fn = _FASTPATH.get(node.target) if node.op == "call_function" else None
        if fn is None:
            return None
        try:
            inspect.signature(fn).bind(*node.args, **node.kwargs)
        except TypeError:
            return None
        return fn

    if not any(plain(n) for n in gm.graph.nodes):
        return gm
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        fn = plain(node)
        if fn is not None:
            node.target = fn
    return torch.fx.GraphModule(gm, graph)
