"""The PTX emulator: runs emitted kernels on the CPU with a race check, from the PTX ISA
(emulate.py; mma.py, wgmma.py: the tensor-core instructions).
"""
