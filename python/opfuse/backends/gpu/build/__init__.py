"""What the GPU emitters are built from: the gpu.launch builder, prepared groups, lanes,
MMA/WGMMA fragments, async copies, tiles, payload evaluation.
"""
