"""The shape of a declaration: one :class:`Setting` per user setting, grouped in a :class:`Stage`.

A setting is declared once, with its type, default, help, allowed values, its command-line spelling and its YAML key;
the parser (:mod:`vocgraft.settings.flags`), the pipeline's schema (:mod:`vocgraft.settings.schema`), the range checks
(``preflight.RULES``) and the ``key=value`` overrides (:mod:`vocgraft.settings.overrides`) are all read from it, so a
default or a range cannot drift between them. This module imports nothing heavy: the lists of choices that live in
torch-importing modules are named with :func:`lazy` and read only when a parser or a check needs them.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

# (test, what the value must be); None (not given) is never tested
Rule = tuple[Callable[[Any], bool], str]
MAX_COUNT = (1 << 31) - 1  # lines, steps, prompts: what an int32 index holds
DERIVED = "derived"  # flag/key: spelled from the name (--seq-len, seq_len)


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def rule(test: Callable[[Any], bool], wanted: str, most: float | None = None) -> Rule:
    """A range rule; ``most`` adds an upper bound (a size past it is a typo, often one allocated at once)."""
    if most is None:
        return test, wanted
    return (lambda v: test(v) and v <= most), f"{wanted}, and at most {most:,}"


def at_least_1(most: float | None = MAX_COUNT) -> Rule:
    return rule(lambda v: v >= 1, "positive", most)


def positive(most: float | None = None) -> Rule:
    return rule(lambda v: finite(v) and v > 0, "> 0 (a finite number)", most)


def non_negative(most: float | None = None) -> Rule:
    return rule(lambda v: finite(v) and v >= 0, ">= 0 (a finite number)", most)


@functools.cache
def _attribute(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def lazy(module: str, name: str) -> Callable[[], Any]:
    """``module.name``, imported when first asked for (choices kept beside the code that uses them)."""
    return lambda: _attribute(module, name)


@dataclass(frozen=True)
class Setting:
    """One user setting. ``flag``/``key``: the command-line and YAML spellings (DERIVED: from the name; None: not
    offered there). ``required`` is the command line's: a pipeline key always has its default."""

    name: str
    type: type
    default: Any = None
    help: str | Callable[[], str] = ""  # a callable: text built from a heavy module, read when a parser is built
    choices: tuple | Callable[[], tuple] | None = None
    rule: Rule | None = None
    flag: str | None = DERIVED
    aliases: tuple[str, ...] = ()  # older flag spellings, still accepted
    key: str | None = DERIVED
    required: bool = False  # on the command line
    nargs: str | None = None
    action: str | None = None  # argparse's, where not store/store_true ("append")
    metavar: str | None = None
    group: str | None = None  # flags of one mutually exclusive group
    yaml_types: tuple[type, ...] | None = None  # default: from ``type`` (a float key takes an int too)

    @property
    def cli_flag(self) -> str | None:
        return "--" + self.name.replace("_", "-") if self.flag == DERIVED else self.flag

    @property
    def yaml_key(self) -> str | None:
        return self.name if self.key == DERIVED else self.key

    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help

    def allowed(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices

    def types(self) -> tuple[type, ...]:
        if self.yaml_types is not None:
            return self.yaml_types
        return (int, float) if self.type is float else (self.type,)

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (None: nothing), as "must be ...; got ..." without the name."""
        if value is None:
            return None
        allowed = self.allowed()
        if allowed is not None and value not in allowed:
            return f"must be one of {', '.join(map(str, allowed))}; got {value!r}"
        if self.rule is not None and not isinstance(value, bool | str) and not self.rule[0](value):
            return f"must be {self.rule[1]}; got {value}"
        return None

    def but(self, **changes: Any) -> Setting:
        """This setting with some fields changed (a stage that offers it with another help or default)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Stage:
    """The settings of one command, in the order its parser lists them (the pipeline's sections list theirs in
    :data:`vocgraft.settings.SECTIONS`, from the same Setting objects)."""

    name: str
    settings: tuple[Setting, ...]
    summary: str = ""
    by_name: dict[str, Setting] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [s.name for s in self.settings]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # a declaration's whole point: one entry per setting
            raise ValueError(f"stage {self.name}: settings declared twice: {', '.join(twice)}")
        object.__setattr__(self, "by_name", {s.name: s for s in self.settings})

    def __getitem__(self, name: str) -> Setting:
        return self.by_name[name]

    def __iter__(self):
        return iter(self.settings)

    def default(self, name: str) -> Any:
        return self.by_name[name].default

    def only(self, names: Iterable[str]) -> tuple[Setting, ...]:
        wanted = set(names)
        return tuple(s for s in self.settings if s.name in wanted)

    def without(self, names: Iterable[str]) -> tuple[Setting, ...]:
        unwanted = set(names)
        return tuple(s for s in self.settings if s.name not in unwanted)
