"""``python -m contextful ...``: the ``contextful`` command."""

from contextful.engine.cli import main

if __name__ == "__main__":
    main()
