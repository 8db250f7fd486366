"""The flat inputs of an exported program from a call, and its results back into the
model's output structure, for both entry points (``torch_backend``).

An exported program's inputs are its graph signature's, in order: user inputs, then
parameters, buffers and constants, which are read from the model by name at every call.
Its outputs are the user's, and the new values of inputs the program updates in place
(an optimizer's parameters and moments, a batch norm's running statistics, an input
written with ``copy_``): those are written back into the tensors they update, as eager
PyTorch would have, before the user's outputs are returned.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from .errors import OpfuseError

__all__ = ["Inputs"]


class Inputs:
    """The exported program's flat inputs from a call's user arguments: parameters and
    buffers read from the model by name at every call, constants as exported; and its
    outputs: the user's (``user_outputs``) and the in-place updates (``updates``)."""

    def __init__(self, exported: Any, model: Any = None):
        from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

        self.getters: list[Callable[[Sequence[Any]], Any]] = []
        self.names: list[str] = []
        self.user_names: list[str] = []
        self.constants: dict[int, Any] = {}  # user leaf -> the value exported (specialized on)
        self.in_spec = exported.call_spec.in_spec
        leaf_names = _leaf_names(self.in_spec)
        n_user = 0
        position: dict[str, int] = {}  # what an in-place update names -> flat input
        for i, spec in enumerate(exported.graph_signature.input_specs):
            position[spec.arg.name] = i
            if spec.target is not None:
                position[spec.target] = i
            if spec.kind == InputKind.USER_INPUT:
                self.getters.append(lambda args, k=n_user: args[k])
                self.user_names.append(f"input {leaf_names[n_user] if leaf_names else n_user}")
                self.names.append(self.user_names[-1])
                if isinstance(spec.arg, ConstantArgument):
                    self.constants[n_user] = spec.arg.value
                n_user += 1
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                               InputKind.CONSTANT_TENSOR):
                get = _state_getter(exported, model, spec.target)
                self.getters.append(lambda args, get=get: get())
                self.names.append(f"{spec.kind.name.lower()} {spec.target!r}")
            else:
                raise OpfuseError(f"input {spec.arg.name!r} of kind {spec.kind.name} unsupported")
        self.user_outputs: list[int] = []
        self.updates: list[tuple[int, int]] = []  # (output, the flat input it updates)
        updating = (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION,
                    OutputKind.PARAMETER_MUTATION)
        for k, spec in enumerate(exported.graph_signature.output_specs):
            if spec.kind == OutputKind.USER_OUTPUT:
                self.user_outputs.append(k)
            elif spec.kind in updating and spec.target in position:
                self.updates.append((k, position[spec.target]))
            else:
                what = spec.target or spec.arg.name
                raise OpfuseError(f"an output of kind {spec.kind.name} ({what!r}) unsupported")
        self.n_user = n_user
        self.out_spec = exported.call_spec.out_spec
        # a tuple whose children are all leaves: unflattened as tuple(results), which is
        # what pytree gives for it, without its per-leaf walk
        spec = self.out_spec
        self._flat_tuple = (spec is not None and spec.type is tuple
                            and spec.num_children == spec.num_leaves
                            and all(c.is_leaf() for c in spec.children()))

    def user_leaves(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        """The user inputs of a call ``(*args, **kwargs)`` in the exported order; a call
        that does not match the example's structure, or changes a constant the program was
        specialized on, is an OpfuseError that says what was expected."""
        n_args, keys = _call_shape(self.in_spec)
        if len(args) != n_args or set(kwargs) != set(keys):
            raise OpfuseError(f"the compiled model takes {_describe(n_args, keys)}, got "
                              f"{_describe_call(args, kwargs)}")
        leaves, spec = pytree.tree_flatten((tuple(args), {k: kwargs[k] for k in keys}))
        if spec != self.in_spec:
            raise OpfuseError(f"the compiled model takes {_describe(n_args, keys)}, got "
                              f"{_describe_call(args, kwargs)} (another structure)")
        for k, leaf in enumerate(leaves):
            if k in self.constants:
                if type(leaf) is not type(self.constants[k]) or leaf != self.constants[k]:
                    raise OpfuseError(f"{self.user_names[k]}: compiled for {self.constants[k]!r}, got "
                                      f"{leaf!r}; compile again for another value")
            elif not isinstance(leaf, torch.Tensor):
                raise OpfuseError(f"{self.user_names[k]}: a tensor, got {type(leaf).__name__}")
        return leaves

    def flat(self, args: Sequence[Any]) -> list[Any]:
        return [get(args) for get in self.getters]

    def finish(self, flat: Sequence[Any], results: list[Any]) -> Any:
        """Write the program's in-place updates into the inputs ``flat`` they update, then
        return the user's outputs in the model's output structure."""
        if self.updates:
            with torch.no_grad():  # what the program computed, as eager's in-place op did
                for k, i in self.updates:
                    flat[i].copy_(results[k])
            results = [results[k] for k in self.user_outputs]
        return self.unflatten(results)

    def unflatten(self, results: list[Any]) -> Any:
        """The model's output structure around ``results`` (the user's outputs)."""
        if self.out_spec is None:
            return results[0] if len(results) == 1 else tuple(results)
        if self._flat_tuple:  # AOTAutograd's graphs return a tuple of tensors
            return tuple(results)
        return pytree.tree_unflatten(results, self.out_spec)


def _call_shape(in_spec: Any) -> tuple[int, list[str]]:
    """How many positional arguments and which keywords the exported ``(args, kwargs)``
    spec has."""
    if in_spec is None or in_spec.num_children != 2:
        return 0, []
    args_spec, kwargs_spec = in_spec.children()
    return args_spec.num_children, list(kwargs_spec.context or [])


def _leaf_names(in_spec: Any) -> list[str]:
    """A name per user leaf: ``0``, ``1`` for positional tensors, ``'mask'`` for keywords
    (empty when the spec has nested structure: then leaves are numbered)."""
    n_args, keys = _call_shape(in_spec)
    if in_spec is None or in_spec.num_leaves != n_args + len(keys):
        return []
    return [str(i) for i in range(n_args)] + [repr(k) for k in keys]


def _describe(n_args: int, keys: list[str]) -> str:
    what = f"{n_args} tensor(s)"
    return what + (f" and keyword(s) {', '.join(keys)}" if keys else "")


def _describe_call(args: tuple, kwargs: dict[str, Any]) -> str:
    parts = [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()]
    return ", ".join(parts) or "nothing"


def _state_getter(exported: Any, model: Any, target: str) -> Callable[[], Any]:
    """Reads a parameter/buffer from the model by name, so the current one is used; a
    constant (or a name export made up) is the exported tensor."""
    if isinstance(model, torch.nn.Module) and target not in exported.constants:
        owner_path, _, attr = target.rpartition(".")
        try:
            owner = model.get_submodule(owner_path)
            getattr(owner, attr)
        except AttributeError:
            pass
        else:
            return lambda: getattr(owner, attr)
    tensor = exported.state_dict[target] if target in exported.state_dict else exported.constants[target]
    return lambda: tensor
