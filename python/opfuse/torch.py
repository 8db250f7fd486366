"""``opfuse.torch``: PyTorch models on opfuse (needs the extra: ``pip install 'opfuse[torch]'``).

    import opfuse.torch
    fast = opfuse.torch.compile(model.eval(), (x,))
    with torch.no_grad():
        y = fast(x)

    y = torch.compile(model, backend="opfuse")(x)   # the Dynamo backend, same compiler

``import opfuse`` does not import this module, so the core package works without torch.
Everything here lives in :mod:`opfuse.torch_backend` (the module the entry point names).
"""

from __future__ import annotations

from .torch_backend import (
    BACKEND_NAME,
    CompiledModule,
    FallbackWarning,
    compile,
    opfuse_backend,
    register,
)

__all__ = [
    "BACKEND_NAME",
    "CompiledModule",
    "FallbackWarning",
    "compile",
    "opfuse_backend",
    "register",
]
