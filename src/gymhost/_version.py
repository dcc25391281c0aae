"""The package version, in a module of its own so subpackages can read it without importing ``gymhost``."""

__version__ = "0.1.0"
