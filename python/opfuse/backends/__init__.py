"""The backends: code generation for the GPU (gpu/) and the CPU (cpu/), and their one options
object (options.py).
"""
