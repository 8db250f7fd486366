"""``python -m bench --train``: one training step (forward, loss, ``loss.backward()``) through
each compiler on the CPU: kernels and milliseconds per step.

Models (built like the zoo's: small sizes, seeded random weights, eval mode so dropout is
off and every compiler's gradients can be compared with eager's): the MLP of the training
issue (linear, LayerNorm, GELU, linear; cross-entropy), the zoo's small CNN
(cross-entropy), and Hugging Face ``BertForSequenceClassification``, ``GPT2LMHeadModel``
and ``LlamaForCausalLM`` called with token ids, a padded attention mask and labels (their
own loss).

Per model and compiler (eager; Inductor: ``torch.compile(model)``; opfuse:
``torch.compile(model, backend="opfuse")``, both default options):

* ``first_s``: the first step's wall time (it compiles the forward, and the backward at
  ``backward()``);
* ``step_ms``: the median step after it, timed in interleaved rounds for ``--budget``
  seconds (default 3) per model;
* ``kernels`` (forward + backward): opfuse's fused kernels in the reports of what the
  backend compiled (``torch_backend.compiled_graphs()``) plus any op left eager; Inductor's
  kernel call sites in its output code for both graphs (``peers.kernels.count_inductor``);
* ``max_grad_error``: the largest gradient difference from eager's, relative to the
  parameter's largest eager gradient (floored at 1e-3 of the model's largest).

Writes ``train.json`` and ``train.md`` to ``--out``.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import zoo_models as zm
from .output import cpu_name, write_table

COMPILERS = ("eager", "inductor", "opfuse")


@dataclass(frozen=True)
class TrainModel:
    """One model of the training benchmark: ``build()`` (a fresh, seeded model),
    ``inputs()`` (its keyword arguments, labels included), ``loss(output)``."""

    name: str
    build: Callable[[], Any]
    inputs: Callable[[], dict[str, Any]]
    loss: Callable[[Any], Any]


def _mlp() -> Any:
    import torch.nn as nn
    import torch.nn.functional as F

    class LayerNormGELU(nn.Module):
        """linear, LayerNorm, GELU (erf), linear."""

        def __init__(self) -> None:
            super().__init__()
            self.l1, self.norm = nn.Linear(64, 128), nn.LayerNorm(128)
            self.l2 = nn.Linear(128, 10)

        def forward(self, x: Any) -> Any:
            return self.l2(F.gelu(self.norm(self.l1(x))))

    return zm._seeded(LayerNormGELU)


def _classes(n: int, k: int) -> Any:
    import torch

    return torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(5))


def _cross_entropy(n: int, k: int) -> Callable[[Any], Any]:
    """Cross-entropy against ``n`` seeded labels of ``k`` classes (drawn at each call: the
    same labels every time, and torch is imported only when a step runs)."""
    def loss(out: Any) -> Any:
        import torch.nn.functional as F

        return F.cross_entropy(out, _classes(n, k))

    return loss


def _hf(name: str) -> Callable[[], Any]:
    def build() -> Any:
        tf = zm._transformers()
        if name == "bert":
            return zm._seeded(lambda: tf.BertForSequenceClassification(
                tf.BertConfig(**zm._ENCODER)))
        if name == "gpt2":
            return zm._seeded(lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
                vocab_size=zm.VOCAB, n_embd=zm.HIDDEN, n_layer=zm.LAYERS, n_head=zm.HEADS,
                n_positions=64)))
        return zm._seeded(lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**zm._GQA)))

    return build


def _hf_inputs(name: str) -> Callable[[], dict[str, Any]]:
    def inputs() -> dict[str, Any]:
        import torch

        out = zm._token_inputs(token_types=name == "bert")
        out["labels"] = torch.tensor([0, 1]) if name == "bert" else out["input_ids"]
        return out

    return inputs


def _random(*shape: int) -> Callable[[], dict[str, Any]]:
    def inputs() -> dict[str, Any]:
        import torch

        return {"x": torch.randn(*shape, generator=torch.Generator().manual_seed(6))}

    return inputs


MODELS: list[TrainModel] = [
    TrainModel("mlp", _mlp, _random(32, 64), _cross_entropy(32, 10)),
    TrainModel("small_cnn", zm.BY_NAME["small_cnn"].build, zm._vision_inputs,
               _cross_entropy(zm.BATCH, 10)),
    TrainModel("bert", _hf("bert"), _hf_inputs("bert"), lambda out: out.loss),
    TrainModel("gpt2", _hf("gpt2"), _hf_inputs("gpt2"), lambda out: out.loss),
    TrainModel("llama", _hf("llama"), _hf_inputs("llama"), lambda out: out.loss),
]
BY_NAME = {m.name: m for m in MODELS}


def step(model: Any, fn: Any, entry: TrainModel, inputs: dict[str, Any]) -> Any:
    """One training step: zeroed gradients, forward, the loss, ``backward()``."""
    model.zero_grad(set_to_none=True)
    loss = entry.loss(fn(**inputs))
    loss.backward()
    return loss


def grads(model: Any) -> dict[str, Any]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def grad_error(got: dict[str, Any], want: dict[str, Any]) -> float:
    """The largest per-parameter error, relative as the module docstring says."""
    if got.keys() != want.keys():
        return float("inf")
    scale = max(g.abs().max().item() for g in want.values())
    return max(((got[k] - w).abs().max().item() / max(w.abs().max().item(), 1e-3 * scale))
               for k, w in want.items())


def _opfuse_kernels(graphs: list[Any]) -> dict[str, int]:
    forward = backward = eager = 0
    for g in graphs:
        reports = getattr(g, "reports", None) or [g.report]
        for r in reports:
            forward += r["forward"]["totals"]["after"]["kernels"] if r.get("forward") else 0
            backward += r["backward"]["totals"]["after"]["kernels"] if r.get("backward") else 0
            eager += len(r["eager"])
    return {"forward": forward, "backward": backward, "eager_ops": eager,
            "kernels": forward + backward + eager}


def run(names: list[str] | None, out: Path, budget_s: float) -> dict:
    import torch
    from torch._inductor.utils import run_and_get_code

    import opfuse.torch
    from opfuse import torch_backend

    from .peers.kernels import count_inductor

    opfuse.torch.register()
    rows = []
    for entry in [m for m in MODELS if names is None or m.name in names]:
        inputs = entry.inputs()
        models, fns, first, kernels, errors = {}, {}, {}, {}, {}
        want = None
        for compiler in COMPILERS:
            torch._dynamo.reset()
            model = models[compiler] = entry.build()
            if compiler == "eager":
                fns[compiler] = model
            else:
                backend = "opfuse" if compiler == "opfuse" else "inductor"
                fns[compiler] = torch.compile(model, backend=backend)
            before = torch_backend.compiled_graphs()  # held: their ids stay theirs
            t0 = time.perf_counter()
            if compiler == "inductor":
                _, codes = run_and_get_code(lambda: step(model, fns[compiler], entry, inputs))
                ind = count_inductor(codes)
                kernels[compiler] = {"kernels": ind["count"], "graphs": len(codes)}
            else:
                step(model, fns[compiler], entry, inputs)
            first[compiler] = time.perf_counter() - t0
            if compiler == "opfuse":
                known = {id(g) for g in before}
                kernels[compiler] = _opfuse_kernels(
                    [g for g in torch_backend.compiled_graphs() if id(g) not in known])
            got = grads(model)
            want = got if want is None else want
            errors[compiler] = grad_error(got, want)
        for compiler in COMPILERS:  # untimed: dynamo.reset() above dropped the earlier compiles
            step(models[compiler], fns[compiler], entry, inputs)
        times: dict[str, list[float]] = {c: [] for c in COMPILERS}
        end = time.perf_counter() + budget_s
        while time.perf_counter() < end or len(times["eager"]) < 3:
            for compiler in COMPILERS:
                t0 = time.perf_counter()
                step(models[compiler], fns[compiler], entry, inputs)
                times[compiler].append((time.perf_counter() - t0) * 1e3)
        eager_ms = statistics.median(times["eager"])
        for compiler in COMPILERS:
            ms = statistics.median(times[compiler])
            rows.append({"model": entry.name, "compiler": compiler, "first_s": first[compiler],
                         "step_ms": ms, "vs_eager": eager_ms / ms, "rounds": len(times[compiler]),
                         "max_grad_error": errors[compiler], **kernels.get(compiler, {})})
            print(f"{entry.name:10s} {compiler:9s} first {first[compiler]:6.2f} s  step "
                  f"{ms:8.3f} ms  x{eager_ms / ms:5.2f} eager  kernels "
                  f"{kernels.get(compiler, {}).get('kernels', '-')}  grad error "
                  f"{errors[compiler]:.1e}", flush=True)
    doc = {"budget_s": budget_s, "rows": rows, "host": cpu_name(), "cpus": os.cpu_count(),
           "threads": torch.get_num_threads(), "load": os.getloadavg(),
           "torch": torch.__version__}
    write_table(out, "train", doc, markdown(doc))
    print(markdown(doc))
    return doc


def markdown(doc: dict) -> str:
    lines = [f"one training step (forward, loss, backward), median of interleaved rounds "
             f"({doc['budget_s']:g} s per model) after the first (compiling) step; "
             f"{doc['host']}, {doc['cpus']} CPUs, torch threads {doc['threads']}, load "
             f"{doc['load'][0]:.2f} at the end; torch {doc['torch']}", "",
             "| model | compiler | first step (s) | step (ms) | vs eager | kernels fwd + bwd "
             "| max grad error |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        k = r.get("kernels", "")
        if r["compiler"] == "opfuse":
            k = f"{r['forward']} + {r['backward']}" + (f" + {r['eager_ops']} eager"
                                                       if r["eager_ops"] else "")
        lines.append(f"| {r['model']} | {r['compiler']} | {r['first_s']:.2f} | "
                     f"{r['step_ms']:.3f} | {r['vs_eager']:.2f} | {k} | "
                     f"{r['max_grad_error']:.1e} |")
    return "\n".join(lines) + "\n"
