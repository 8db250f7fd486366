"""The compile driver: the one stage graph, the codegen options and the program cache.

It sits above every compiler layer (pipeline, backends, report) and below the API and the
tools; the runtime never imports it (docs/architecture.md).
"""
