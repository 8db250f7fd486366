"""The PyTorch importer: FX graphs to linalg (importer.py), aten rules (aten*.py),
decompositions and partitioning.
"""
