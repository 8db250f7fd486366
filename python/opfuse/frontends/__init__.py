"""Frontends: getting a linalg module from MLIR text (mlir/: the input contract), the Python
builder (builder/) or PyTorch (torch/).
"""
