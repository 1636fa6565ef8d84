"""``python -m engine.cli`` runs the ``contextful`` command."""

from contextful.engine.cli import main

main()
