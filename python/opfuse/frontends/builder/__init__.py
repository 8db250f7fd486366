"""The Python graph builder (``opfuse.builder.Graph``), its MLIR printer, its NumPy reference
and the example graphs G1-G8.
"""
