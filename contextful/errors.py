"""The error catalogue, public: every error Contextful raises is a ``ContextfulError`` from here.

``except contextful.errors.TransientError`` catches what a retry may cure; each error's
``category`` and ``exit_code`` say how the CLI and the served faces report it (docs/cli.md).
"""

from contextful.storage import errors as _catalogue
from contextful.storage.errors import *

__all__ = list(_catalogue.__all__)
