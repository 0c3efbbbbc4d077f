"""rayft's version, in a module of its own so that any layer can name it without importing the
package root (whose lazy exports reach the recipes)."""

__version__ = "0.1.0"
