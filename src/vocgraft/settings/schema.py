"""The pipeline config's schema from declarations: each section's keys, their types and defaults, and the ranges
and choices every value is checked against (the same ones the command line's flags have)."""

from __future__ import annotations

from typing import Any

from vocgraft.settings.setting import Setting

REQUIRED = object()  # a key without a default: the config must give it


def section_schema(settings: tuple[Setting, ...], required: tuple[str, ...] = ()) -> dict[str, tuple]:
    """key -> (types, default) of a section."""
    return {
        s.yaml_key: (s.types(), REQUIRED if s.yaml_key in required else s.default)
        for s in settings
        if s.yaml_key is not None
    }


def problems(settings: tuple[Setting, ...], section: dict | None, where: str) -> list[str]:
    """Every value of a validated ``section`` outside its declared range or choices, as "where.key must be ...";
    a nested section (adapt.vocadt) is walked by its caller."""
    if section is None:
        return []
    found = []
    for setting in settings:
        value: Any = section.get(setting.yaml_key)
        problem = setting.problem(value)
        if problem:
            found.append(f"{where}{setting.yaml_key} {problem}")
    return found
