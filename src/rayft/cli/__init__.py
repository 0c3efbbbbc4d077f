"""The ``rayft`` command line: one command per capability, each taking a YAML config and overrides.

Each command imports the recipe or capability package it runs inside its function, so that
``rayft --help`` loads the config tree alone (no recipes, no numpy; torch and ray never load at import).
"""
