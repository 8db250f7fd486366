"""fuse-run's inputs and its comparison of fused against unfused outputs.

Seeded random inputs, ``--inputs`` .npy files (loaded and checked against the entry's
signature), the memory check before a run, and the element-wise comparison with its
per-element-type tolerances.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.runtime.schedule import bf16_bits_to_float32, contiguous, float32_to_bf16_bits
from opfuse.runtime.signature import Signature, TensorSpec

#: Exit code when fused and unfused outputs differ beyond the tolerance.
EXIT_MISMATCH = 3

#: Default (rtol, atol) per element type; an element passes when
#: |fused - unfused| <= atol + rtol * |unfused| (numpy.isclose), NaN equal to NaN.
#: In f32, fused and unfused run the same ops in the same order per element today
#: (bit-identical on G1-G8); these leave room for what fusion may legitimately change:
#: reassociated reductions and contracted multiply-adds, a few ulps over a kernel. In f16
#: and bf16 a fused kernel may also skip rounding its intermediates to the element type
#: (seen: 1-ulp differences on a bf16 add-exp-mul chain), hence a few ulps of those types.
TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-12, 1e-14),
    "f32": (1e-5, 1e-6),
    "f16": (1e-2, 1e-3),
    "bf16": (2e-2, 1e-2),
}
#: Integer outputs must match exactly.
EXACT = (0.0, 0.0)

#: Random inputs: floats uniform in [RANDOM_LOW, RANDOM_HIGH), drawn in float64 and rounded
#: to the element type (as ``Graph.random_inputs`` does); integers uniform in
#: [INT_LOW, INT_HIGH). One generator per run, inputs drawn in argument order.
RANDOM_LOW, RANDOM_HIGH = -1.0, 1.0
INT_LOW, INT_HIGH = -8, 8

#: Elements compared per step (bounds the float64 temporaries on large outputs).
_CHUNK = 1 << 20


# --- inputs ---------------------------------------------------------------------------------


def random_inputs(signature: Signature, seed: int) -> list[np.ndarray]:
    """Seeded random inputs for ``signature`` (see RANDOM_LOW/HIGH, INT_LOW/HIGH); bf16
    inputs are uint16 bit patterns."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in signature.inputs:
        if spec.element_type == "bf16":
            values = rng.uniform(RANDOM_LOW, RANDOM_HIGH, spec.shape).astype(np.float32)
            arrays.append(float32_to_bf16_bits(values))
        elif np.issubdtype(spec.dtype, np.floating):
            arrays.append(rng.uniform(RANDOM_LOW, RANDOM_HIGH, spec.shape).astype(spec.dtype))
        else:
            arrays.append(rng.integers(INT_LOW, INT_HIGH, spec.shape, dtype=spec.dtype))
    return arrays


def _nbytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * spec.dtype.itemsize


def available_memory() -> int | None:
    """Bytes of memory available now (MemAvailable on Linux), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(signature: Signature) -> None:
    """Refuse a run whose inputs and outputs (fused and unfused) alone need more memory
    than the machine has available, before allocating any of it (numpy would raise
    MemoryError, or the kernel's OOM killer end the process)."""
    need = sum(_nbytes(s) for s in signature.inputs) + 2 * sum(
        _nbytes(s) for s in signature.outputs)
    have = available_memory()
    if have is not None and need > have:
        gib = 2**30
        raise OpfuseError(
            f"@{signature.name}: its inputs and the fused and unfused outputs need "
            f"{need / gib:.3g} GiB, more than the {have / gib:.3g} GiB of memory available "
            "here")


def input_paths(text: str, signature: Signature) -> list[Path]:
    """The files ``--inputs`` names: a comma-separated list, or one directory holding
    ``in0.npy``, ``in1.npy``, ... (what --save-outputs writes)."""
    items = [s.strip() for s in text.split(",")]
    if any(not s for s in items):
        raise OpfuseError(f"--inputs: empty file name in '{text}'")
    if len(items) == 1 and Path(items[0]).is_dir():
        return [Path(items[0]) / f"in{i}.npy" for i in range(len(signature.inputs))]
    if len(items) != len(signature.inputs):
        raise OpfuseError(
            f"--inputs: @{signature.name} takes {len(signature.inputs)} input(s) "
            f"({_types(signature.inputs)}), got {len(items)} file(s)"
        )
    return [Path(s) for s in items]


def load_inputs(paths: Sequence[Path], signature: Signature) -> list[np.ndarray]:
    """Load and check one ``.npy`` per input (exact dtype and shape, no casts)."""
    return [_check_input(_load_npy(p), spec, i, p) for i, (p, spec) in
            enumerate(zip(paths, signature.inputs))]


def _load_npy(path: Path) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic[:2] == b"PK":  # a zip archive: np.savez's .npz
            raise OpfuseError(f"--inputs: {path} is an .npz archive; pass one .npy per input")
        if magic != b"\x93NUMPY":
            raise OpfuseError(f"--inputs: {path} is not a .npy file (no .npy header)")
        return np.load(path, allow_pickle=False)
    except OSError as e:
        raise OpfuseError(f"--inputs: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # object arrays (pickles), truncated or corrupt files
        raise OpfuseError(f"--inputs: cannot load {path}: {e}") from None


def _check_input(array: np.ndarray, spec: TensorSpec, index: int, path: Path) -> np.ndarray:
    what = f"--inputs: {path} (input #{index}, {spec})"
    if spec.element_type == "bf16" and array.dtype.name == "bfloat16":
        array = array.view(np.uint16)  # ml_dtypes.bfloat16: the same bits
    if array.dtype != spec.dtype:
        hint = ""
        if spec.element_type == "bf16":
            hint = (" (bf16 inputs are uint16 bit patterns: see "
                    "opfuse.runtime.schedule.float32_to_bf16_bits)")
        raise OpfuseError(f"{what}: dtype {array.dtype}, expected {spec.dtype}{hint}")
    if tuple(array.shape) != spec.shape:
        raise OpfuseError(f"{what}: shape {tuple(array.shape)}, expected {spec.shape}")
    return contiguous(array)


def _types(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(map(str, specs)) or "none"


# --- comparing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Fused against unfused for one output.

    Attributes:
        max_abs: max |fused - unfused| (NaN if only one side is NaN somewhere).
        max_rel: max |fused - unfused| / |unfused| over elements where unfused != 0
            (elements where it is 0 are judged by max_abs and atol).
        mismatches: elements outside ``atol + rtol * |unfused|``.
        elements: elements compared.
        rtol, atol: the tolerance applied.
        worst: index of the worst mismatching element, with (fused, unfused) there.
    """

    max_abs: float
    max_rel: float
    mismatches: int
    elements: int
    rtol: float
    atol: float
    worst: tuple[tuple[int, ...], float, float] | None = None

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def default_tolerance(element_type: str) -> tuple[float, float]:
    """(rtol, atol) for outputs of this element type (TOLERANCES; integers exact)."""
    return TOLERANCES.get(element_type, EXACT)


def as_float64(array: np.ndarray, element_type: str) -> np.ndarray:
    """Values as float64 (bf16 bit patterns decoded)."""
    if element_type == "bf16":
        array = bf16_bits_to_float32(array)
    return np.asarray(array, dtype=np.float64)


def compare(
    fused: np.ndarray, unfused: np.ndarray, element_type: str, rtol: float, atol: float
) -> Comparison:
    """Compare two outputs of the same shape and element type, chunk by chunk."""
    f, u = fused.reshape(-1), unfused.reshape(-1)
    max_abs = max_rel = 0.0
    mismatches, worst, worst_diff = 0, None, -1.0
    for start in range(0, f.size, _CHUNK):
        fc = as_float64(f[start : start + _CHUNK], element_type)
        uc = as_float64(u[start : start + _CHUNK], element_type)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            same = (fc == uc) | (np.isnan(fc) & np.isnan(uc))  # also equal infinities
            diff = np.where(same, 0.0, np.abs(fc - uc))  # NaN where one side is NaN
            bad = ~(same | (diff <= atol + rtol * np.abs(uc)))
            rel = np.where(~same & (uc != 0), diff / np.abs(uc), 0.0)
        max_abs = _nan_max(max_abs, float(diff.max()))
        max_rel = _nan_max(max_rel, float(rel.max()))
        n_bad = int(np.count_nonzero(bad))
        if n_bad:
            mismatches += n_bad
            score = np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0)
            i = int(np.argmax(score))
            if score[i] > worst_diff:
                worst_diff = float(score[i])
                index = tuple(int(k) for k in np.unravel_index(start + i, fused.shape))
                worst = (index, float(fc[i]), float(uc[i]))
    return Comparison(max_abs, max_rel, mismatches, int(f.size), rtol, atol, worst)


def _nan_max(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)
