"""The operator commands over the Store methods, one module a command
(``buried``, ``topics``, ``relays``) and what they print (``output``), so an
application can build the same tools on them."""

from __future__ import annotations

from outbox.service.admin.buried import list_buried, purge, requeue, show
from outbox.service.admin.output import Refused, as_json, confirm, table
from outbox.service.admin.relays import relay_record, relays_list, serving_relays
from outbox.service.admin.topics import DEFAULT, checked, governed, topics_list, topics_set

__all__ = [
    "DEFAULT",
    "Refused",
    "as_json",
    "checked",
    "confirm",
    "governed",
    "list_buried",
    "purge",
    "relay_record",
    "relays_list",
    "requeue",
    "serving_relays",
    "show",
    "table",
    "topics_list",
    "topics_set",
]
