"""fuse-run's library: the fused-versus-unfused harness.

Compile a graph twice (fused and unfused, through ``opfuse.compile``), run both on the
same inputs, compare them element by element (``compare``), time them interleaved
(``timing``), search the fusion fuel for the first fusion that changes the results
(``bisect``) and summarise (``run_summary``). It sits above the API; ``tools/fuse_run.py``
is the command line over it.
"""
