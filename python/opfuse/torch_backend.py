"""PyTorch models on opfuse: ``opfuse.torch.compile`` and ``torch.compile(backend="opfuse")``.

Both export the model (or Dynamo's FX graph) with ``torch.export`` and opfuse's
decompositions, split the ATen graph into the largest partitions opfuse supports and the
ops it does not (:mod:`opfuse.frontends.torch.partition`), compile every partition with
:func:`opfuse.compile` and run the split graph: compiled partitions on opfuse's backend,
the ops left eager in PyTorch between them (:mod:`opfuse.torch_partitions`, which also
says how tensors cross). A model with one unsupported op still gets every other fusion;
one :class:`FallbackWarning` per graph names the ops left eager and why, and
``report["eager"]`` lists them (``report["partitions"]``: every partition's ops, kernels
and fusion report).

Parameters are read at **every call** (by their qualified names on the model, so
in-place updates, ``load_state_dict`` and re-assigned parameters are all seen); reading
one costs an attribute lookup and a zero-copy numpy view.

Training: ``torch.compile(backend="opfuse")`` called while autograd records compiles the
forward and the backward graph (:mod:`opfuse.torch_training`, through AOTAutograd).
``opfuse.torch.compile`` compiles the forward pass only: a call of its module while
autograd is recording runs the model eagerly instead, with a :class:`FallbackWarning`.

The Dynamo backend never fails the user's model: a graph that does not export runs
eagerly whole, a partition that does not compile or fails at its first call runs
eagerly, each with a :class:`FallbackWarning` that names the reason (an unknown
``options=`` key is the one error it raises: a typo is no reason to run eagerly). A graph
Dynamo traced with symbolic sizes is compiled per concrete shape
(:mod:`opfuse.torch_shapes`).
It is registered under the name ``opfuse`` through the ``torch_dynamo_backends`` entry
point; :func:`register` does the same in-process where the package is not installed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import warnings
import weakref
from typing import Any, Callable, Iterator, Sequence

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "opfuse.torch needs PyTorch: pip install 'opfuse[torch]' (torch==2.13.0)"
    ) from e

from .errors import OpfuseError
from .frontends.torch.importer import example_args, export, export_fx
from .frontends.torch.importer import example_kwargs as _example_kwargs
from .torch_inputs import Inputs
from .torch_shapes import DimCompiledModule, ShapeSpecializedGraph, is_symbolic, item_inputs
from .torch_training import compile_training, is_training
from .torch_partitions import (
    TORCH_DTYPES,
    FallbackWarning,
    PartitionedProgram,
    reason,
    warn,
)

__all__ = ["CompiledModule", "FallbackWarning", "compile", "compiled_graphs", "opfuse_backend",
           "register"]

#: The name ``torch.compile(backend=...)`` knows opfuse by.
BACKEND_NAME = "opfuse"
_TORCH_DTYPES = TORCH_DTYPES


# --------------------------------------------------------------------------- public API


def compile(  # noqa: A001  (opfuse.torch.compile mirrors torch.compile)
    model: Any,
    example_inputs: Any = (),
    *,
    example_kwargs: dict[str, Any] | None = None,
    target: str = "sm_90",
    backend: str = "auto",
    dynamic_shapes: Any = None,
    **options: Any,
) -> "CompiledModule | DimCompiledModule":
    """Compile ``model`` for the shapes and dtypes of ``example_inputs``.

    The exported graph is split into the largest partitions opfuse supports, each compiled
    and fused; the ops opfuse does not support run eagerly in PyTorch between them, named
    by one :class:`FallbackWarning` and in ``report["eager"]`` with the reason.

    Args:
        model: A ``torch.nn.Module`` in eval mode (training-mode dropout is unsupported).
        example_inputs: A tensor or a sequence of tensors (the positional arguments).
        example_kwargs: The keyword arguments, as ``torch.export.export`` takes them:
            tensors (``attention_mask=...``) and constants the program is specialized on
            (``use_cache=True``; a call with another value is refused). A Hugging Face
            decoder's ``DynamicCache`` output (the default ``use_cache=True``) is returned
            as the model returns it.
        target: The GPU the cost model plans for (``sm_80``, ``sm_90``).
        backend: ``auto`` (cuda when a GPU runtime is usable, else cpu), ``cpu`` or ``cuda``.
        dynamic_shapes: torch.export's ``dynamic_shapes`` (``{"x": {0: Dim("batch")}}``):
            checked by torch.export against the example, then the model is compiled at
            each call's shapes (a :class:`opfuse.torch_shapes.DimCompiledModule`).
        **options: Passed to :func:`opfuse.compile` (``fusion=False``, ``pipeline=...``,
            pass options such as ``delta=0.2``).

    Returns:
        A callable taking tensors of the example inputs' shapes and dtypes, positional and
        keyword as in the example, and returning the model's output structure with torch
        tensors in it.

    Raises:
        OpfuseError: the model does not export, or a partition does not compile.
    """
    if dynamic_shapes is not None:
        args, kwargs = example_args(example_inputs), _example_kwargs(example_kwargs)
        _check_dynamic_shapes(model, args, kwargs, dynamic_shapes)
        return DimCompiledModule(
            model, lambda a, k: compile(model, a, example_kwargs=k, target=target,
                                        backend=backend, **options), args, kwargs)
    with _no_mha_fastpath(), _quiet_export():
        program = export(model, example_args(example_inputs), _example_kwargs(example_kwargs))
    partitioned = PartitionedProgram(
        program, strict=True, backend=backend, target=target, **options
    )
    return CompiledModule(model, program, partitioned)


def _check_dynamic_shapes(model: Any, args: tuple, kwargs: dict, dynamic_shapes: Any) -> None:
    """torch.export's check of ``dynamic_shapes`` against the example, as an OpfuseError."""
    try:
        with _no_mha_fastpath(), _quiet_export():
            torch.export.export(model, args, kwargs or None, dynamic_shapes=dynamic_shapes,
                                strict=False)
    except Exception as e:  # noqa: BLE001  (export's constraint errors: keep the first lines)
        text = str(e).strip().splitlines()
        first = " ".join(line.strip() for line in text[:3] if line.strip())
        raise OpfuseError(f"dynamic_shapes: torch.export refuses them: {type(e).__name__}: "
                          f"{first}") from e


class CompiledModule:
    """A model compiled by :func:`compile`; call it like the model.

    Attributes:
        model: The model (its parameters are read at every call).
        program: The partitioned, compiled program (``program.partitions``,
            ``program.eager``).
    """

    def __init__(self, model: Any, exported: Any, program: PartitionedProgram):
        self.model = model
        self.program = program
        self._inputs = Inputs(exported, model)

    @property
    def report(self) -> dict:
        """Totals over the compiled partitions (``report["totals"]["before"/"after"]
        ["kernels"]``), each partition's fusion report, and the ops left eager."""
        return self.program.report

    @property
    def executable(self) -> Any:
        """The first compiled partition's Executable (the only one of a model opfuse
        compiles whole); None if nothing compiled."""
        parts = self.program.partitions
        return parts[0].program.executable if parts else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = self._inputs.flat(self._inputs.user_leaves(args, kwargs))
        if _autograd_recording(flat):
            warn(_AUTOGRAD_REASON)
            return self.model(*args, **kwargs)
        self.program.check(flat, self._inputs.names)
        return self._inputs.finish(flat, self.program(flat))

    def write_report(self, folder: Any) -> list[Any]:
        """``fuse-run --report``'s files (``report.html``, ``report.json``,
        ``report.txt``) for each compiled partition: in ``folder`` itself when the model
        compiled as one partition, else in ``folder/<partition name>/``. Returns the HTML
        files' paths."""
        from pathlib import Path

        from .report.render import write_report_dir

        parts = self.program.partitions
        if len(parts) == 1:
            return [write_report_dir(folder, parts[0].program.executable.report)]
        return [write_report_dir(Path(folder) / p.name, p.program.executable.report)
                for p in parts]

    def __repr__(self) -> str:
        totals = self.report["totals"]
        kernels = "/".join(str(totals[k]["kernels"]) for k in ("before", "after"))
        backend = self.executable.backend if self.executable else "eager"
        return (f"CompiledModule({type(self.model).__name__}, backend={backend!r}, "
                f"kernels before/after={kernels}, eager ops={len(self.program.eager)})")


def opfuse_backend(
    gm: Any, example_inputs: Sequence[Any], *, options: dict | None = None, mode: str | None = None
) -> Callable:
    """The ``torch.compile`` backend: compile Dynamo's FX graph partition by partition.

    ``torch.compile(model, backend="opfuse", options={"backend": "cpu", "delta": 0.2})``
    passes ``options`` here: the keywords of :func:`opfuse.compile` (``target``,
    ``backend``, ``threads``, ``matmul``, ...) and the default pipeline's pass options.
    ``mode`` changes nothing (opfuse has one mode); a value other than ``"default"`` is
    named in a warning once.

    A graph Dynamo traced with symbolic sizes (the model called at a second shape), or
    with a float it made dynamic, is compiled at each concrete shape (and value) it is
    called with (:mod:`opfuse.torch_shapes`).

    Returns:
        A function of the graph's inputs returning its outputs: the split graph, its
        supported partitions compiled and the rest eager (named by a
        :class:`FallbackWarning`); ``gm.forward`` itself, with a warning, when the graph
        does not export at all.

    Raises:
        OpfuseError: an option opfuse does not know (a typo is not a reason to run eagerly).
    """
    opts = _checked_options(options)
    _note_mode(mode)
    if is_training(example_inputs):  # forward and backward graphs, through AOTAutograd
        compile_static = functools.partial(_training_graph, opts=opts)
    else:
        compile_static = functools.partial(_static_graph, opts=opts)
    if is_symbolic(example_inputs) or item_inputs(gm):  # sizes or floats Dynamo made dynamic
        # specialized before AOTAutograd, so that its graphs are static and compiled
        # when Dynamo's graph first meets a shape, not inside AOTAutograd's own call
        return _remember(ShapeSpecializedGraph(
            gm, lambda specialized, args: compile_static(specialized, args, eager=gm)))
    return _remember(compile_static(gm, example_inputs))


def _training_graph(gm: Any, example_inputs: Sequence[Any], opts: dict[str, Any],
                    eager: Any = None) -> Callable:
    """``gm`` through AOTAutograd (``torch_training``), its forward and backward graphs
    compiled by :func:`_static_graph`; ``eager.forward`` (or ``gm``'s), warned, where
    AOTAutograd itself fails."""
    eager = gm if eager is None else eager
    try:
        with _quiet_export():
            return compile_training(gm, example_inputs,
                                    lambda graph, args: _static_graph(graph, args, opts),
                                    _guard_options(opts))
    except Exception as e:  # noqa: BLE001  (never fail the user's model: run it eagerly)
        warn(f"running eagerly, not compiled: AOTAutograd failed: {reason(e)}")
        return eager.forward


#: Weak references to the graphs the backend compiled in this process, latest last: a
#: graph Dynamo drops (``torch._dynamo.reset()``, a freed model) is not kept alive here.
_GRAPHS: list[weakref.ref] = []


def _remember(compiled: Any) -> Any:
    if not inspect.ismethod(compiled):  # gm.forward (run eagerly) has no report
        _GRAPHS[:] = [r for r in _GRAPHS if r() is not None]
        _GRAPHS.append(weakref.ref(compiled))
    return compiled


def compiled_graphs() -> list[Any]:
    """What ``torch.compile(backend="opfuse")`` compiled in this process and Dynamo still
    holds, latest last: each has a ``report``; a training graph's has the forward's and
    the backward's (``report["forward"]``, ``report["backward"]``), the tensors the forward
    saves and the recomputation decision; a graph compiled per shape has ``reports``."""
    return [g for g in (r() for r in _GRAPHS) if g is not None]


def _guard_options(opts: dict[str, Any]) -> Any:
    """The guard's thresholds among the backend's options (``GuardOptions``' fields:
    ``delta``, ``r_limit``, ``target``, ...), for decisions taken outside a pipeline."""
    import dataclasses

    from .cost.guard import GuardOptions

    names = {f.name for f in dataclasses.fields(GuardOptions)}
    given = {k.replace("-", "_"): v for k, v in opts.items()}
    return GuardOptions(**{k: v for k, v in given.items() if k in names})


def _static_graph(gm: Any, example_inputs: Sequence[Any], opts: dict[str, Any],
                  eager: Any = None) -> Callable:
    """``gm`` compiled for the shapes of ``example_inputs`` (or, warned, ``eager.forward``:
    ``gm``'s unless another graph is the eager one)."""
    eager = gm if eager is None else eager
    try:
        with _quiet_export():
            exported = export_fx(_decompose_fastpath(gm), example_inputs)
        program = PartitionedProgram(exported, **opts)
        return _DynamoGraph(eager, exported, program)
    except Exception as e:  # noqa: BLE001  (never fail the user's model: run it eagerly)
        warn(f"running eagerly, not compiled: {reason(e)}")
        return eager.forward


def _checked_options(options: dict | None) -> dict[str, Any]:
    """``options`` as :func:`opfuse.compile` keywords; an unknown key raises, listing the
    valid ones."""
    from . import api
    from .pipeline import default_option_names

    opts = dict(options or {})
    valid = set(api.COMPILE_KEYWORDS) | set(default_option_names()) | {"disable"}
    unknown = sorted(k for k in opts if k.replace("-", "_") not in valid)
    if unknown:
        raise OpfuseError(
            f"torch.compile(backend={BACKEND_NAME!r}): unknown option(s) "
            f"{', '.join(map(repr, unknown))}; valid options: {', '.join(sorted(valid))}")
    import torch

    if torch.are_deterministic_algorithms_enabled() and "atomics" not in opts:
        # GPU sums added atomically differ from run to run in their last bits
        opts["atomics"] = False
    return opts


_MODES_NOTED: set[str] = set()


def _note_mode(mode: str | None) -> None:
    """Name a ``mode=`` opfuse ignores, once per value (Inductor's ``max-autotune``,
    ``reduce-overhead``: opfuse's kernels are chosen by its cost model either way)."""
    if mode in (None, "default") or mode in _MODES_NOTED:
        return
    _MODES_NOTED.add(mode)
    warnings.warn(f"opfuse: torch.compile(mode={mode!r}) changes nothing in opfuse (it has one "
                  "mode: the cost model picks the kernels)", UserWarning, stacklevel=3)


def register(name: str = BACKEND_NAME) -> None:
    """Make ``torch.compile(backend=name)`` find :func:`opfuse_backend`.

    Not needed once opfuse is installed with its ``torch_dynamo_backends`` entry point;
    then (and on a second call) this does nothing.
    """
    from torch._dynamo import list_backends, register_backend

    if name not in list_backends(exclude_tags=()):
        register_backend(compiler_fn=opfuse_backend, name=name)


# --------------------------------------------------------------------------- calls


class _DynamoGraph:
    """What the backend returns for a compiled graph: Dynamo calls it with the graph's inputs.

    An autograd-recording call runs ``gm.forward`` instead, with a warning; a partition that
    fails at call time runs eagerly from then on (``CompiledPartition``).
    """

    def __init__(self, gm: Any, exported: Any, program: PartitionedProgram):
        self.gm = gm
        self.program = program
        self._inputs = Inputs(exported, gm)

    @property
    def report(self) -> dict:
        """The partitioned program's report (see ``PartitionedProgram.report``)."""
        return self.program.report

    def __call__(self, *args: Any) -> Any:
        if _autograd_recording(args):
            warn(_AUTOGRAD_REASON)
            return self.gm.forward(*args)
        flat = self._inputs.flat(args)
        return self._inputs.finish(flat, self.program(flat))


_AUTOGRAD_REASON = (
    "running eagerly, not compiled: autograd is recording (grad mode is on and an input or "
    "parameter requires grad) and this program computes the forward pass only; call the "
    "model under torch.no_grad() or torch.inference_mode(), or compile it with "
    "torch.compile(model, backend='opfuse'), which compiles the backward too"
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
