"""A config that failed validation, still read by its cross-field rules so that one load reports every problem: each
section that validates on its own is kept, and one that cannot stand in is an `Invalid`, whose every read raises
SectionInvalid. builders/config.py skips a rule that raises SectionInvalid; any other exception in a rule is a bug and
propagates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


class SectionInvalid(Exception):
    """A cross-field rule read a required field or section that failed its own validation (or is missing)."""


class Invalid:
    """Stands in for a field or section that failed its own validation: reading anything from it (an attribute, its
    text, a lookup by it) raises SectionInvalid."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise SectionInvalid(f"{self._name}.{attr}")

    def __format__(self, spec: str) -> str:
        raise SectionInvalid(self._name)

    def __hash__(self) -> int:
        raise SectionInvalid(self._name)

    def __str__(self) -> str:
        raise SectionInvalid(self._name)


def partial_model(model: type[M], data: dict[str, Any], checks: dict[str, Callable[[Any], Any]]) -> M:
    """`model` built without validation from the parts of `data` that validate on their own: a section (a model
    field) that does not keeps its default, or is Invalid when the field is required; a field named in `checks` is
    that function's result, or Invalid when it raises ValueError; a required field missing from `data` is Invalid;
    any other field is taken as it is."""
    valid: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if name not in data:
            if info.is_required():
                valid[name] = Invalid(name)
            continue
        try:
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                valid[name] = ann.model_validate(data[name])
            elif name in checks:
                valid[name] = checks[name](data[name])
            else:
                valid[name] = data[name]
        except ValueError:  # pydantic's ValidationError is a ValueError
            if info.is_required() or name in checks:
                valid[name] = Invalid(name)
    return model.model_construct(**valid)
