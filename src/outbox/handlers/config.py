"""Parse a handler kind's spec.config into its model, with errors that name fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

__all__ = ["parse_config"]

C = TypeVar("C", bound=BaseModel)


def parse_config(model: type[C], config: Mapping[str, Any]) -> C:
    """``config`` as ``model``; ValueError naming each bad field (never quoting values)."""
    try:
        return model.model_validate(dict(config))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise ValueError(problems) from None
