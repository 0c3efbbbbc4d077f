"""``python -m rayft`` runs the command line."""

from rayft.cli.main import main

main()
