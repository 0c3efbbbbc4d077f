"""The ``rayft`` command line: one command per capability, each taking a YAML config and overrides.

Every command that runs something runs it through :mod:`rayft.api` (the functions Python callers
use, so a command's defaults live once); the few that run nothing of rayft's (``config``,
``profile``, ``submit``, ``jobs``) say in their module why they call a package directly. Commands
import what they run inside their function, so that ``rayft --help`` loads the config tree alone
(no recipes, no numpy; torch and ray never load at import).
"""
