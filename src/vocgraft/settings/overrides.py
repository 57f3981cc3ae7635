"""``key=value`` overrides of a pipeline config (`vocgraft run CONFIG train.lr=3e-4 eval.limit=50`), typed by the
declaration: a key that is not a setting, or a value that is not of its type, is refused naming the valid keys."""

from __future__ import annotations

from typing import Any

from vocgraft.errors import UserError

TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
UNSET = ("null", "none", "~", "")  # back to the default


class OverrideError(UserError, ValueError):
    """A ``key=value`` that names no setting or gives a value of the wrong type."""


def parse_value(text: str, types: tuple[type, ...], key: str) -> Any:
    """``text`` as the setting's type (YAML would read ``3e-4`` as a string and ``on`` as a boolean)."""
    if text.strip().lower() in UNSET:
        return None
    if bool in types:
        word = text.strip().lower()
        if word in TRUE + FALSE:
            return word in TRUE
    elif int in types or float in types:
        try:
            return int(text)
        except ValueError:
            if float in types:
                try:
                    return float(text)
                except ValueError:
                    pass
    elif str in types:
        return text
    wanted = " or ".join(t.__name__ for t in types)
    raise OverrideError(f"{key}={text}: {key} must be {wanted}; got {text!r}.")


def _keys(schema: dict, prefix: str = "") -> list[str]:
    found = []
    for key, rule in schema.items():
        found += _keys(rule, f"{prefix}{key}.") if isinstance(rule, dict) else [f"{prefix}{key}"]
    return found


def apply_overrides(raw: dict, overrides: list[str], schema: dict) -> dict:
    """``raw`` (a config as read from YAML) with each ``dotted.key=value`` set; ``schema``: key -> (types, default)
    or a nested section (:func:`vocgraft.pipeline.config.schema`)."""
    raw = dict(raw)
    for item in overrides:
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals or not key:
            raise OverrideError(f"{item!r}: an override is KEY=VALUE, e.g. train.lr=3e-4 or eval.limit=50.")
        *sections, name = key.split(".")
        rules, holder, where = schema, raw, ""
        for section in sections:
            if not isinstance(rules.get(section), dict):
                valid = ", ".join(k for k, r in rules.items() if isinstance(r, dict))
                raise OverrideError(f"{item}: {where}{section!r} is not a section; sections here: {valid}.")
            rules, where = rules[section], f"{where}{section}."
            inner = holder.get(section)
            holder[section] = dict(inner) if isinstance(inner, dict) else {}
            holder = holder[section]
        if name not in rules or isinstance(rules[name], dict):
            valid = ", ".join(_keys(rules, where))
            here = f" in {where[:-1]}" if where else ""
            raise OverrideError(f"{item}: unknown key {key!r}; valid keys{here}: {valid}.")
        types = rules[name][0]
        holder[name] = parse_value(text, types if isinstance(types, tuple) else (types,), key)
    return raw
