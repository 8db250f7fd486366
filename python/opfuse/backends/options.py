"""Code-generation choices that are the user's, not the cost model's.

``compile_module(..., matmul="simt", allow_tf32=True)`` (and ``Executable.gpu_program`` /
``save_bundle``, which pass them on), or the environment (``OPFUSE_MATMUL``,
``OPFUSE_ALLOW_TF32``: :mod:`opfuse.config`) when the argument is not given:

* ``matmul``: which matmul kernel to build, for every kernel or per kernel:
  ``auto`` (tensor cores where the operand types allow them, else SIMT), ``mma`` (the same:
  f32 operands use tensor cores only with ``allow_tf32``), ``wgmma`` (f16/bf16 operands on
  the warpgroup instruction of sm_90a, :mod:`opfuse.backends.gpu.emit.matmul_wgmma`; every compile target must be
  ``sm_90a``), ``simt`` (the FFMA kernel), or a comma-separated list of ``<kernel>=<mode>``
  entries and at most one bare default mode (``fusion_3_output=simt,mma``), so a GPU run
  can measure the variants of one kernel side by side. ``auto`` does not pick ``wgmma``:
  it has not run on a device yet (its layouts are checked by the emulator only), and
  ``mma`` is the tensor-core path every sm_80+ target can run.
* ``allow_tf32``: f32 matmuls may use TF32 tensor cores (``m16n8k8``: operands rounded to
  10 mantissa bits). Off by default, as PyTorch's ``torch.backends.cuda.matmul.allow_tf32``:
  f32 results then stay IEEE and comparable with the CPU reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import config
from ..errors import OpfuseError

MATMUL_MODES = ("auto", "mma", "wgmma", "simt")
#: Targets whose code may use the warpgroup MMA (``wgmma.mma_async``).
WGMMA_CHIPS = ("sm_90a",)


@dataclass(frozen=True)
class CodegenOptions:
    """Resolved options (see the module docstring).

    Attributes:
        matmul: the mode spec, as given (``auto``, ``simt``, ``k=simt,mma``, ...).
        allow_tf32: f32 matmuls may use TF32 tensor cores.
        target: the chip launch shapes are tuned for (the first compile target).
        targets: every compile target (``wgmma`` kernels need all of them ``sm_90a``).
    """

    matmul: str = "auto"
    allow_tf32: bool = False
    target: str = "sm_90"
    targets: tuple[str, ...] = ("sm_90",)

    def __post_init__(self) -> None:
        _parse(self.matmul)  # a bad spec fails when the options are made

    def matmul_mode(self, kernel: str) -> str:
        """``auto``, ``mma``, ``wgmma`` or ``simt`` for kernel ``kernel``."""
        default, per_kernel = _parse(self.matmul)
        return per_kernel.get(kernel, default)

    @property
    def wgmma_targets(self) -> bool:
        """Every compile target can run ``wgmma``."""
        return bool(self.targets) and all(t in WGMMA_CHIPS for t in self.targets)

    @classmethod
    def resolve(
        cls,
        matmul: str | None = None,
        allow_tf32: bool | None = None,
        target: str = "sm_90",
        targets: tuple[str, ...] | None = None,
    ) -> "CodegenOptions":
        """Arguments first, then ``$OPFUSE_MATMUL`` / ``$OPFUSE_ALLOW_TF32``, then defaults."""
        if matmul is None:
            matmul = config.MATMUL.get() or "auto"
        if allow_tf32 is None:
            allow_tf32 = config.ALLOW_TF32.flag()
        return cls(matmul, bool(allow_tf32), target, tuple(targets or (target,)))


def _parse(spec: str) -> tuple[str, dict[str, str]]:
    default, per_kernel = "auto", {}
    bare = 0
    for part in filter(None, (p.strip() for p in str(spec).split(","))):
        name, _, mode = part.rpartition("=")
        if mode not in MATMUL_MODES:
            raise OpfuseError(
                f"matmul mode {part!r} (in {spec!r}): expected {', '.join(MATMUL_MODES)}, "
                "or <kernel>=<mode>"
            )
        if name:
            per_kernel[name] = mode
        else:
            bare += 1
            default = mode
    if bare > 1:
        raise OpfuseError(f"matmul modes {spec!r}: more than one default mode")
    return default, per_kernel


__all__ = ["CodegenOptions", "MATMUL_MODES", "WGMMA_CHIPS"]
