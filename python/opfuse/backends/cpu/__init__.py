"""The CPU backend: tensor-level kernels lowered to one LLVM-dialect module the runtime JITs
(lower.py).
"""
