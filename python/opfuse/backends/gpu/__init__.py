"""The GPU backend: emit/ (one module per kernel family), build/ (the blocks emitters use),
lower/ (NVVM, PTX, ptxas, the host schedule), compiler.py (compile_module, GpuProgram).
"""
