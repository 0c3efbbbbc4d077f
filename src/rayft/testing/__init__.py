"""What users testing their own setups need, shared with rayft's tests and benchmarks: tiny random
models and tokenizers built offline in seconds (:mod:`~rayft.testing.tiny`), named architectures with
random weights (:mod:`~rayft.testing.architectures`), the small T5 of ``configs/t5-sql-cpu.yaml``
(:mod:`~rayft.testing.sql_t5`), small prepared datasets for the training loop alone
(:mod:`~rayft.testing.units`), a local Ray sized for CPU tests (:mod:`~rayft.testing.ray_cluster`) and a
tools environment whose episodes call tools even with a random model (:mod:`~rayft.testing.environments`).

rayft's own test machinery (fake servers, object stores, log parsers) lives under ``tests/support/``,
outside the package. Nothing in the product imports this package.
"""

from rayft.testing.tiny import build_tiny_bart, build_tiny_model, build_tiny_t5, build_tiny_tokenizer

__all__ = ["build_tiny_bart", "build_tiny_model", "build_tiny_t5", "build_tiny_tokenizer"]
