"""GPU emitters: one module per kernel family, chosen per group kind in the order opfuse.kinds
gives.
"""
