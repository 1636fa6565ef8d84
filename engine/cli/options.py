"""The global options, given before the subcommand or after it.

``--project``, ``--store``, ``--machine``, ``--json``, ``-v`` and ``--debug`` belong to the ``contextful`` group
(``contextful --json build status``), and every leaf command accepts them too, as users type them
(``contextful build status --json``). The group's values start ``ctx.obj`` (a dict keyed by
:data:`KEYS`, which every command reads); a value given after the subcommand overrides it.
:func:`accept_after_subcommands` adds the options to every leaf of the command tree once it is
built, so a command added later accepts them with no work of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

KEYS = ("store", "project", "machine", "json", "verbose", "debug")
"""``ctx.obj``'s keys: one per global option."""

F = TypeVar("F", bound=Callable[..., Any])


def _specs(after: bool) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Each global option's names and settings; ``after``: the copy a leaf command takes."""
    return [
        (("--store", "store"), {"default": None, "metavar": "URL",
                                **({} if after else {"envvar": "CONTEXTFUL_STORE"}),
                                "help": "Store root (path or fsspec URL; env CONTEXTFUL_STORE). Default: the project's store."}),
        (("--project", "project"), {"default": None if after else ".", "show_default": not after, "metavar": "DIR",
                                    "type": click.Path(file_okay=False),
                                    "help": "Project directory: the nearest contextful.toml at or above it."}),
        (("--machine", "machine"), {"default": None, "metavar": "FILE", "type": click.Path(dir_okay=False),
                                    "help": "Machine configuration: this machine's derive engine bindings (env "
                                            "CONTEXTFUL_MACHINE). Default: contextful.machine.toml beside "
                                            "contextful.toml (docs/derive.md)."}),
        (("--json", "json"), {"is_flag": True, "help": "Print machine-readable JSON."}),
        (("-v", "--verbose", "verbose"), {"is_flag": True,
                                          "help": "Log each pull's details on stderr (masked cells per column, ...)."}),
        (("--debug", "debug"), {"is_flag": True,
                                "help": "On an error, print its full trace instead of writing it to a log file."}),
    ]


def global_options(group: F) -> F:
    """The options on the ``contextful`` group itself."""
    for names, settings in reversed(_specs(after=False)):
        group = click.option(*names, **settings)(group)
    return group


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.INFO if verbose else logging.WARNING)


def _given_after(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """A global option given after the subcommand: it overrides the group's value."""
    if value is None or value is False or param.name is None:
        return
    ctx.obj[param.name] = value
    if param.name == "verbose":
        configure_logging(True)


def _leaves(command: click.Command) -> Iterator[click.Command]:
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _leaves(sub)
    else:
        yield command


def accept_after_subcommands(root: click.Group) -> None:
    """Give every leaf command under ``root`` the global options (those it does not define itself)."""
    for command in _leaves(root):
        taken = {opt for p in command.params for opt in p.opts}
        for names, settings in _specs(after=True):
            flags = [n for n in names if n.startswith("-")]
            if taken.isdisjoint(flags):
                command.params.append(click.Option(list(names), expose_value=False, callback=_given_after,
                                                   **settings))
