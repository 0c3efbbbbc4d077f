"""The ``rayft`` command line: one command per capability, each taking a YAML config and overrides."""
