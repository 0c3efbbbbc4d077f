"""Synthetic data generation: symbolic GSM8K variations and LLM teachers, verified and deduplicated.

The recipe that runs it is :mod:`rayft.recipes.sdg` (``rayft sdg CONFIG``).
"""
