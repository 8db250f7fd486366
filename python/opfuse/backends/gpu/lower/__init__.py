"""Lowering the kernels: NVVM and PTX (nvptx.py, in a worker process), ptxas, and the host
schedule.
"""
