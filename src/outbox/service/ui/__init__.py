"""The operator console: ``outbox ui``, a JSON API over the Store's operator
methods, with API tokens by role (docs/operators/console.md)."""

from outbox.service.ui.api import Console
from outbox.service.ui.tokens import Identity, Role, TokenFile

__all__ = ["Console", "Identity", "Role", "TokenFile"]
