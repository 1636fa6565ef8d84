"""``python -m engine.cli`` runs the ``contextful`` command."""

from engine.cli import main

main()
