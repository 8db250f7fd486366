"""opfuse's version, in a module of its own so that any layer can read it (bundles record
it) without importing the package facade."""

__version__ = "0.1.0"
