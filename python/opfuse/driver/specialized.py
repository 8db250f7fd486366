"""An entry function with ``?`` dims: compiled at each call's argument shapes.

``opfuse.compile`` of a module whose entry takes ``tensor<?x...>`` returns a
:class:`SpecializedExecutable`. A call specializes the module at its arrays' shapes
(:func:`opfuse.frontends.mlir.specialize.specialize`), compiles that static program with
the same options, and keeps it for the next call with those shapes: the fusion, the
kernels and their numerics are the static program's at that size. A new shape costs a
compile (the symbolic compile that serves every size with one program is issue 25's
remaining work); :attr:`specializations` says which shapes have been compiled.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import OpfuseError

Shapes = tuple[tuple[int, ...], ...]


class SpecializedExecutable:
    """A dynamic entry function, compiled per argument shapes.

    Attributes:
        entry: the entry function's name.
        specializations: the Executable of each argument-shape tuple compiled so far.
    """

    def __init__(self, entry: str, argument_dims: list[list[int | None]],
                 compile_at: Callable[[Shapes], Any]):
        self.entry = entry
        self.argument_dims = argument_dims
        self.specializations: dict[Shapes, Any] = {}
        self._compile_at = compile_at

    def at(self, *shapes: Sequence[int]) -> Any:
        """The Executable for argument ``shapes`` (compiled now unless it was before)."""
        key: Shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        exe = self.specializations.get(key)
        if exe is None:
            exe = self._compile_at(key)
            self.specializations[key] = exe
        return exe

    def __call__(self, *arrays: np.ndarray) -> Any:
        """Run the entry function at the arrays' shapes."""
        if len(arrays) != len(self.argument_dims):
            raise OpfuseError(f"@{self.entry} takes {len(self.argument_dims)} arrays, got "
                              f"{len(arrays)}")
        return self.at(*(np.shape(a) for a in arrays))(*arrays)

    def time(self, *arrays: np.ndarray, **options: Any) -> list[float]:
        """:meth:`Executable.time` of the specialization at the arrays' shapes."""
        return self.at(*(np.shape(a) for a in arrays)).time(*arrays, **options)

    @property
    def report(self) -> dict:
        """The fusion report of the latest specialization (with its ``shapes``)."""
        if not self.specializations:
            raise OpfuseError(f"@{self.entry} has dynamic dims: its report is a "
                              "specialization's; call it (or .at(*shapes)) first")
        shapes, exe = next(reversed(self.specializations.items()))
        return {**exe.report, "shapes": [list(s) for s in shapes]}

    def __repr__(self) -> str:
        dims = ", ".join("x".join("?" if d is None else str(d) for d in a) for a in
                         self.argument_dims)
        return (f"SpecializedExecutable(@{self.entry}({dims}), "
                f"{len(self.specializations)} shape(s) compiled)")


__all__ = ["SpecializedExecutable"]
