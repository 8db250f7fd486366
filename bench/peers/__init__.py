"""The peers opfuse is measured against: numpy eager, torch eager, torch.compile, jax.jit,
and IREE on one thread and on every core (:mod:`bench.peers.iree`).

Each peer is optional (torch and jax come with the ``bench`` extra): :func:`discover`
returns the peers it found and, for each one it did not, the reason. A found peer
``prepare``s a G graph (its version from :mod:`bench.peers.models`) on the benchmark's
numpy inputs and returns a :class:`Prepared`: a zero-argument function running the
graph once (result ready on return), the first output as numpy, the compile time and the
kernel count where the peer compiles. A peer whose ``source`` is ``"mlir"`` (IREE) gets
the case's MLIR text instead of a model function: it runs files too.
"""

from __future__ import annotations

import functools
import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .kernels import INDUCTOR_METHOD, XLA_METHOD, count_inductor, count_xla

#: Peer names, in the order tables and charts show them.
PEERS = ("numpy", "torch_eager", "torch_compile", "jax_jit", "iree_st", "iree_mt")


def not_available(reason: str) -> dict[str, str]:
    """The JSON stand-in for a figure that could not be measured."""
    return {"not_available": reason}


@dataclass
class Prepared:
    """One graph, ready to run on one peer."""

    run: Callable[[], Any]
    output: np.ndarray
    compile_s: float | dict = field(default_factory=lambda: not_available("eager: no compile"))
    kernels: dict = field(default_factory=lambda: not_available("eager: no kernel count"))


class Peer:
    """A peer: ``name``, ``version``, ``prepare(model, arrays) -> Prepared``.

    ``init_s`` is the one-time cost of the peer's first compile in the process (measured
    on a tiny graph at discovery, like opfuse's ``process_init_s``), so that it is not
    charged to the first G graph.
    """

    name = ""
    version = ""
    init_s = 0.0
    source = "model"  # what prepare() takes: "model" (a bench.peers.models function) or "mlir"

    def warm_up(self) -> None:
        t0 = time.perf_counter()
        self.prepare(_tiny, [np.ones((4, 4), np.float32)]).run()
        self.init_s = time.perf_counter() - t0

    def prepare(self, model: Callable[..., Any], arrays: Sequence[np.ndarray]) -> Prepared:
        raise NotImplementedError


class NumpyPeer(Peer):
    name = "numpy"

    def __init__(self) -> None:
        from . import numpy_ops

        self.ops = numpy_ops
        self.version = np.__version__

    def prepare(self, model, arrays):
        fn = functools.partial(model, self.ops, *arrays)
        return Prepared(fn, np.asarray(fn()))


class TorchEagerPeer(Peer):
    name = "torch_eager"

    def __init__(self, threads: int) -> None:
        import torch

        from . import torch_ops

        if threads > 0:
            torch.set_num_threads(threads)
        self.torch, self.ops, self.version = torch, torch_ops, torch.__version__

    def _call(self, fn, tensors):
        def run():
            with self.torch.inference_mode():
                return fn(*tensors)

        return run

    def prepare(self, model, arrays):
        tensors = [self.torch.from_numpy(a) for a in arrays]
        run = self._call(functools.partial(model, self.ops), tensors)
        return Prepared(run, run().numpy())


class TorchCompilePeer(TorchEagerPeer):
    """torch.compile (Inductor, default mode) with Inductor's on-disk FX graph cache off,
    so the compile time is a cold compile every run."""

    name = "torch_compile"

    def __init__(self, threads: int) -> None:
        super().__init__(threads)
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False

    def prepare(self, model, arrays):
        from torch._inductor import metrics
        from torch._inductor.utils import run_and_get_code

        self.torch._dynamo.reset()
        metrics.reset()
        tensors = [self.torch.from_numpy(a) for a in arrays]
        run = self._call(self.torch.compile(functools.partial(model, self.ops)), tensors)
        t0 = time.perf_counter()
        out, codes = run_and_get_code(run)
        compile_s = time.perf_counter() - t0
        kernels = count_inductor(codes)
        kernels["method"] = INDUCTOR_METHOD
        kernels["generated_kernel_count_metric"] = int(metrics.generated_kernel_count)
        return Prepared(run, out.numpy(), compile_s, kernels)


class JaxJitPeer(Peer):
    name = "jax_jit"

    def __init__(self) -> None:
        import jax

        from . import jax_ops

        self.jax, self.ops, self.version = jax, jax_ops, jax.__version__

    def prepare(self, model, arrays):
        args = [self.jax.device_put(a) for a in arrays]
        t0 = time.perf_counter()
        compiled = self.jax.jit(functools.partial(model, self.ops)).lower(*args).compile()
        compile_s = time.perf_counter() - t0
        kernels = count_xla(compiled.as_text())
        kernels["method"] = XLA_METHOD

        def run():
            return compiled(*args).block_until_ready()

        return Prepared(run, np.asarray(run()), compile_s, kernels)


def _tiny(ops: Any, x: Any) -> Any:
    return ops.tanh(x) * x


def discover(threads: int, skip: Sequence[str] = ()) -> tuple[dict[str, Peer], dict[str, str]]:
    """The peers importable here, and why each other one is not.

    Args:
        threads: intra-op threads for torch (0: the library's default).
        skip: peer names not to load, with the reason ``skipped``.
    """
    makers: dict[str, Callable[[], Peer]] = {
        "numpy": NumpyPeer,
        "torch_eager": lambda: TorchEagerPeer(threads),
        "torch_compile": lambda: TorchCompilePeer(threads),
        "jax_jit": JaxJitPeer,
        **_iree_makers(threads),
    }
    found, missing = {}, {}
    for name in PEERS:
        if name in skip:
            missing[name] = "skipped (--quick, or --no-peers for torch and jax)"
            continue
        try:
            found[name] = makers[name]()
            found[name].warm_up()
        except ImportError as e:
            missing[name] = f"not installed ({e}); pip install '.[bench]'"
        except Exception as e:  # a broken install must not stop the benchmark
            missing[name] = f"failed to load: {type(e).__name__}: {e}"
    return found, missing


def _iree_makers(threads: int) -> dict[str, Callable[[], Peer]]:
    try:
        from .iree import make_peers

        return make_peers(threads)
    except ImportError as e:  # reported per peer by discover(), like the others
        error = e

        def missing() -> Peer:
            raise error

        return {"iree_st": missing, "iree_mt": missing}


def version_of(module: str) -> str | None:
    """``module.__version__`` if importable, else None."""
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:
        return None
