"""The cost model: the one GPU target table, the fusion guard, kernel-time estimates.

``targets`` holds every figure of every GPU (:data:`TARGETS`); ``guard`` decides every
fusion (``fuse(A,B) <=> R_fused < R_limit and (Q_unfused - Q_fused)/Q_unfused > delta``)
and estimates registers; ``gpu_time`` estimates kernel times from launch shapes. The cost
model is numbers only: it imports no IR analysis, and everything above it may ask it.
"""

from .guard import *  # noqa: F401,F403
from .guard import __all__ as _guard_all
from .targets import *  # noqa: F401,F403
from .targets import __all__ as _targets_all

__all__ = [*_targets_all, *_guard_all]
