"""The stage graph: every artifact a program passes through, named once.

``linalg`` (the input, checked by the input contract) -> ``fused`` (after the fusion
pipeline) -> the GPU backend's ``kernels`` -> ``nvvm`` -> ``ptx`` -> ``cubin`` and
``bundle``, and the CPU backend's ``cpu``. A stage names its parent; ``fuse-opt --emit=``
takes any stage, ``Executable.ir(stage)`` any stage that is a module's text, and the
``--timing`` lines use the same names (:mod:`opfuse.driver.progress`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OpfuseError


@dataclass(frozen=True)
class Stage:
    """One stage.

    Attributes:
        name: what ``--emit=``, ``ir()`` and the timing lines call it.
        parent: the stage it is built from (None: the input).
        help: one line for ``--help``.
        backend: ``gpu`` or ``cpu`` for a backend's stage, None for the compiler's.
        binary: the artifact is bytes (a bundle), not text; no ``ir()`` view.
    """

    name: str
    parent: str | None
    help: str
    backend: str | None = None
    binary: bool = False


STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("linalg", None, "the input as parsed"),
    Stage("fused", "linalg", "after the fusion pipeline (default)"),
    Stage("kernels", "fused", "one gpu.launch per fused kernel (GPU codegen)", "gpu"),
    Stage("nvvm", "fused", "the kernels lowered to the NVVM (LLVM) dialect", "gpu"),
    Stage("ptx", "fused", "PTX of every kernel", "gpu"),
    Stage("cubin", "fused", "ptxas -v figures per kernel (needs ptxas)", "gpu"),
    Stage("bundle", "fused", "AOT bundle: kernels, host schedule, CPU library (-o FILE)", "gpu",
          binary=True),
    Stage("cpu", "fused", "the LLVM-dialect module of the CPU backend", "cpu"),
)}

#: The stages an Executable holds as module text, in pipeline order.
MODULE_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES.values() if not s.binary)


def get(name: str) -> Stage:
    """The stage called ``name``.

    Raises:
        OpfuseError: no such stage, naming the known ones.
    """
    if name not in STAGES:
        raise OpfuseError(f"unknown stage '{name}' (stages: {', '.join(STAGES)})")
    return STAGES[name]


def chain(name: str) -> list[str]:
    """The stages from the input to ``name``, in order."""
    names = []
    stage: str | None = name
    while stage:
        names.append(stage)
        stage = get(stage).parent
    return names[::-1]


def help_lines() -> list[str]:
    """``  <name> <help>`` per stage, for ``--help``."""
    return [f"  {s.name:8} {s.help}" for s in STAGES.values()]


__all__ = ["MODULE_STAGES", "STAGES", "Stage", "chain", "get", "help_lines"]
