"""The data plane: reading datasets, rendering and tokenizing examples, packing, caching.

By role: :mod:`~rayft.data.read` reads any dataset a row at a time (the one reader);
:mod:`~rayft.data.builtin` generates the built-in sets (``builtin:arithmetic``, ``builtin:sql``);
the modules here prepare training data (formats, splits, tokenizing, packing, windows, the prepared
cache and its report) and batch it (``collate.py``).
"""
