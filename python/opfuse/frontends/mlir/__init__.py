"""The input contract for linalg MLIR: which ops and forms are accepted (ops.py), widening
(widen.py), the checks (contract.py).
"""
