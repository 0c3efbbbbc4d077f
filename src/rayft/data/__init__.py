"""The data plane: reading datasets, rendering and tokenizing examples, packing, caching."""
