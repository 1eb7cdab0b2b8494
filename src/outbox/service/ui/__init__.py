"""The operator console: ``outbox ui``, HTML pages and a JSON API over the
Store's operator methods, by role (docs/operators/console.md)."""

from outbox.service.ui.access import Access, Proxy
from outbox.service.ui.app import Console
from outbox.service.ui.tokens import Identity, Role, TokenFile

__all__ = ["Access", "Console", "Identity", "Proxy", "Role", "TokenFile"]
