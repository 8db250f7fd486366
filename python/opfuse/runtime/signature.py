"""The calling convention at a program's boundary: the entry's inputs and outputs.

    * inputs are numpy arrays, one per argument of the entry function, with exactly the
      argument's shape and dtype (no silent casts);
    * a function with one result returns one ``np.ndarray``; a function with several
      results returns a ``tuple`` of arrays, in result order;
    * ``bf16`` has no numpy dtype: bf16 inputs and outputs are ``np.uint16`` arrays holding
      the bit patterns (``ml_dtypes.bfloat16`` arrays are accepted as inputs when that
      package is installed). :func:`float32_to_bf16_bits` and :func:`bf16_bits_to_float32`
      convert.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np
from mlir import ir

from ..errors import OpfuseError
from .schedule import DTYPES, bf16_bits_to_float32, contiguous, float32_to_bf16_bits  # noqa: F401

# MLIR element type -> numpy dtype at the function boundary (bf16 travels as its bits);
# kept in the MLIR-free schedule module, which bundles use without the compiler.
_NUMPY_DTYPES = DTYPES


@dataclass(frozen=True)
class TensorSpec:
    """Shape and element type of one argument or result.

    Attributes:
        shape: static dimensions.
        element_type: the MLIR spelling (``f32``, ``f16``, ``bf16``, ``i32``, ...).
    """

    shape: tuple[int, ...]
    element_type: str

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype used at the boundary (``uint16`` for bf16 bit patterns)."""
        return _NUMPY_DTYPES[self.element_type]

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.element_type}>"


@dataclass(frozen=True)
class Signature:
    """Inputs and outputs of an entry function."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"@{self.name}({ins}) -> ({outs})"

    def check_inputs(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """Validate call arguments against the signature.

        Returns:
            The arrays, C-contiguous (copied only where they were not), bf16 ones viewed
            as ``uint16``.

        Raises:
            OpfuseError: wrong count, shape or dtype, naming the argument.
        """
        expected = self._expected
        if len(arrays) == len(expected) and all(
                type(a) is np.ndarray and a.dtype == dtype and a.shape == shape
                and a.flags.c_contiguous for a, (shape, dtype) in zip(arrays, expected)):
            return list(arrays)  # the common case, checked in one pass (per-call cost)
        if len(arrays) != len(self.inputs):
            raise OpfuseError(
                f"@{self.name} takes {len(self.inputs)} input(s) {self._ins()}, got {len(arrays)}"
            )
        checked = []
        for i, (a, spec) in enumerate(zip(arrays, self.inputs)):
            if not isinstance(a, np.ndarray):
                raise OpfuseError(
                    f"@{self.name} input #{i}: expected a numpy array {spec}, "
                    f"got {type(a).__name__}"
                )
            if spec.element_type == "bf16" and a.dtype.name == "bfloat16":
                a = a.view(np.uint16)  # ml_dtypes.bfloat16: same bits
            if a.dtype != spec.dtype:
                bf16 = spec.element_type == "bf16"
                hint = " (bf16 is passed as uint16 bit patterns)" if bf16 else ""
                raise OpfuseError(
                    f"@{self.name} input #{i}: expected dtype {spec.dtype} for {spec}, "
                    f"got {a.dtype}{hint}"
                )
            if tuple(a.shape) != spec.shape:
                raise OpfuseError(
                    f"@{self.name} input #{i}: expected shape {spec.shape} for {spec}, "
                    f"got {tuple(a.shape)}"
                )
            checked.append(contiguous(a))
        return checked

    @cached_property
    def _expected(self) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        return tuple((tuple(spec.shape), spec.dtype) for spec in self.inputs)

    def _ins(self) -> str:
        return "(" + ", ".join(map(str, self.inputs)) + ")"


def signature_of(func: ir.Operation) -> Signature:
    """The Signature of a tensor-level ``func.func``.

    Raises:
        OpfuseError: an argument or result that is not a statically shaped tensor of a
            supported element type (i1 is rejected: store booleans as i8).
    """
    name = ir.StringAttr(func.attributes["sym_name"]).value
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)

    def spec(t: ir.Type, what: str) -> TensorSpec:
        if not isinstance(t, ir.RankedTensorType):
            raise OpfuseError(f"@{name} {what}: only ranked tensors are supported, got {t}")
        if not t.has_static_shape:
            raise OpfuseError(f"@{name} {what}: dynamic shapes are not supported yet, got {t}")
        elem = str(t.element_type)
        if elem not in _NUMPY_DTYPES:
            hint = " (store booleans as i8)" if elem == "i1" else ""
            raise OpfuseError(f"@{name} {what}: element type {elem} is not supported{hint}")
        return TensorSpec(tuple(t.shape), elem)

    inputs = tuple(spec(t, f"input #{i}") for i, t in enumerate(ftype.inputs))
    outputs = tuple(spec(t, f"result #{i}") for i, t in enumerate(ftype.results))
    return Signature(name, inputs, outputs)
