"""Contract compatibility against the published build (decision "minor-contract-bump").

Under the published build's major (``run.model.contract-major``), a contract that drops or
retypes a published column, makes a non-null column nullable, adds a non-null column or changes
the grain refuses as ``ContractMismatch`` naming the column and the major to bump. A contract that
only adds nullable columns or makes nullable ones non-null (``run.model.contract-minor``)
publishes once its minor exceeds the published one, else refuses naming the added or tightened
column and the bumped minor. A higher major admits anything; a lower one refuses.

    >>> from engine.model.spec import ColumnContract as C, Contract
    >>> old = Contract("1.0", ("k",), {"k": C("string", False)})
    >>> check_contract("m", Contract("1.1", ("k",), {"k": C("string", False), "v": C("double")}), old)
"""

from __future__ import annotations

from contextful.engine.land.typed import parse_type
from contextful.engine.model.spec import Contract
from contextful.storage.errors import ContractMismatch


def check_contract(model: str, new: Contract, published: Contract | None) -> None:
    """Raise ContractMismatch when ``new`` may not publish over ``published``."""
    if published is None or new.major > published.major:
        return
    major_bump = f"{published.major + 1}.0"
    if new.major < published.major:
        raise ContractMismatch(model, next(iter(new.columns), "-"),
                               f"contract {new.version} is below the published {published.version}", major_bump)
    if new.grain != published.grain:
        column = next((c for c in (*new.grain, *published.grain) if c not in new.grain or c not in published.grain),
                      ",".join(new.grain))
        raise ContractMismatch(model, column, f"grain {list(new.grain)} differs from the published "
                               f"{list(published.grain)} under major {published.major}", major_bump)
    loosened: list[str] = []
    for column, old in published.columns.items():
        now = new.columns.get(column)
        if now is None:
            raise ContractMismatch(model, column, f"drops a column published under major {published.major}",
                                   major_bump)
        if parse_type(now.type, column) != parse_type(old.type, column):
            raise ContractMismatch(model, column, f"retypes {old.type} to {now.type} under major {published.major}",
                                   major_bump)
        if now.nullable and not old.nullable:
            raise ContractMismatch(model, column, f"makes a non-null column nullable under major {published.major}",
                                   major_bump)
        if old.nullable and not now.nullable:
            loosened.append(column)
    added = [c for c in new.columns if c not in published.columns]
    for column in added:
        if not new.columns[column].nullable:
            raise ContractMismatch(model, column, f"adds a non-null column under major {published.major}", major_bump)
    changed = added + loosened
    if changed and new.minor <= published.minor:
        column = changed[0]
        what = "adds the nullable column" if column in added else "tightens to non-null the column"
        raise ContractMismatch(model, column, f"{what} {column!r} under contract {published.version} without a "
                               "minor bump", f"{published.major}.{published.minor + 1}")
