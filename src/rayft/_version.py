"""The package version, in a module of its own so that any module can read it without importing
the package root (whose lazy exports would otherwise close an import circle)."""

__version__ = "0.1.0"
