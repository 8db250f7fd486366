"""``python -m bench.zoo_gpu [model ...]``: the GPU kernels of the model zoo's partitions
(``python -m bench.zoo_gpu --train [model ...]``: of a training step's forward and backward
graphs, for ``bench/train.py``'s models).

Each model (``bench/zoo_models.py``; default: the convolutional ones, ``small_cnn vit
whisper_encoder wav2vec2``; ``all`` for the whole zoo) is compiled through
``torch.compile(backend="opfuse")`` on the CPU, as the zoo test calls it; the inputs each
compiled partition received are kept, and its GPU program is built for sm_80 and sm_90
(ptxas when found: registers, spills) and run in the emulator (race check on) on them,
against the partition's own eager ATen submodule. One line per partition: kernels by
emitter, the emitters' notes (kernels left to the fallback and why), the most registers
and any spills, the max error relative to max(1, max |eager|). Exit 1 if an error exceeds
1e-4 or a kernel spills. Slow (minutes per transformer: the emulator runs every thread
in numpy); not part of the test suite, which checks the models' convolution layers
(``test/unit/test_gpu_conv_models.py``).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONVOLUTIONAL = ("small_cnn", "vit", "whisper_encoder", "wav2vec2")
TOL = 1e-4


def check(entry: Any) -> bool:
    """Print one line per partition of ``entry``; whether all of them passed."""
    from .zoo import compile_with_opfuse

    return check_partitions(entry.name, lambda: compile_with_opfuse(entry))


def check_training(entry: Any) -> bool:
    """:func:`check` for one training step of a ``bench/train.py`` model: the partitions of
    its forward and its backward graph."""
    import torch

    from .train import step

    def run() -> None:
        torch._dynamo.reset()
        model = entry.build()
        step(model, torch.compile(model, backend="opfuse", options={"backend": "cpu"}), entry,
             entry.inputs())

    return check_partitions(f"{entry.name} (training)", run, against_cpu=True)


def check_partitions(name: str, run: Any, against_cpu: bool = False) -> bool:
    """Every partition ``run()`` calls, on the inputs of its first call: built for the GPU
    and emulated; one line each; whether all of them passed. The reference is the
    partition's own ATen submodule run eagerly, or (``against_cpu``) the results the CPU
    backend gave on that call: AOTAutograd's graphs are written for a compiler (a ``view``
    where eager PyTorch would need a ``reshape``), and their gradients are checked against
    eager's end to end (``test_torch_training.py``)."""
    import torch

    from opfuse import torch_partitions as tp
    from opfuse.testing.emulator import emulate
    from opfuse.backends.gpu.lower import ptxas

    seen: dict[int, tuple[Any, list, list]] = {}
    forward = tp.CompiledPartition.forward

    def recording(self: Any, *tensors: Any) -> Any:
        inputs = [t.detach().clone() for t in tensors]
        results = forward(self, *tensors)
        seen.setdefault(id(self), (self, inputs, [r.detach().clone() for r in results]))
        return results

    tp.CompiledPartition.forward = recording
    tp.GPU_LAYOUT_ON_CPU = True  # the partitions as the GPU backend would import them
    try:
        run()
    finally:
        tp.CompiledPartition.forward = forward
        tp.GPU_LAYOUT_ON_CPU = False
    have_ptxas = ptxas.find_ptxas() is not None
    ok = True
    for part, tensors, cpu_results in seen.values():
        program = part.program.executable.gpu_program(("sm_80", "sm_90"), ptxas=have_ptxas)
        kernels = list(program.kernels.values())
        emitters = Counter(k.emitter for k in kernels)
        regs = spills = 0
        heavy = []  # the kernels that spill, by name: what to look at
        if have_ptxas:
            for k in kernels:
                for chip, res in k.resources.items():
                    regs = max(regs, res["registers"])
                    spilled = res["spill_stores"] + res["spill_loads"]
                    spills += spilled
                    if spilled:
                        heavy.append(f"{k.name} ({k.emitter}, {chip}): {res['registers']} "
                                     f"registers, {spilled} spill bytes")
        arrays = emulate.run_program(program, [tp.to_numpy(t) for t in tensors])
        got = part.program.as_results(arrays, tensors)  # viewed as the graph's results
        if against_cpu:
            want = cpu_results
        else:
            with torch.no_grad():
                want = part.eager(*tensors)
            want = want if isinstance(want, (tuple, list)) else (want,)
        err = 0.0
        shapes_match = len(got) == len(want)
        for g, w in zip(got, want):
            shapes_match &= tuple(g.shape) == tuple(w.shape)
            if w.numel() and tuple(g.shape) == tuple(w.shape):
                w = w.double()
                diff = (g.double() - w).abs().max().item()
                err = max(err, diff / max(1.0, w.abs().max().item()))
        good = err <= TOL and spills == 0 and shapes_match
        ok &= good
        print(f"{name} {part.name}: {len(kernels)} kernels {dict(sorted(emitters.items()))}"
              f"{' registers<=' + str(regs) + ' spills=' + str(spills) if have_ptxas else ' (no ptxas)'}"
              f" max_error={err:.2g} {'ok' if good else 'FAILED'}"
              + "".join(f"\n    note: {n}" for n in program.notes)
              + "".join(f"\n    spills: {h}" for h in heavy), flush=True)
    return ok


def main(argv: list[str]) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from .zoo_models import ZOO

    if argv[:1] == ["--train"]:  # the training steps of bench/train.py's models
        from .train import BY_NAME, MODELS

        names = argv[1:] or [m.name for m in MODELS]
        unknown = set(names) - set(BY_NAME)
        if unknown:
            print(f"unknown models: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 1
        return 0 if all([check_training(BY_NAME[n]) for n in names]) else 1
    names = argv or list(CONVOLUTIONAL)
    entries = ZOO if names == ["all"] else [m for m in ZOO if m.name in names]
    unknown = set(names) - {m.name for m in ZOO} - {"all"}
    if unknown:
        print(f"unknown models: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 1
    results = [check(entry) for entry in entries]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
