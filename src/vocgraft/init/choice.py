"""A method chosen once: the ``--init`` name resolved to its registered :class:`~vocgraft.init.Method` with its
settings checked and defaulted. Code after the choice receives this object, not the name, so the name is looked
up and the settings validated once per run (for `vocgraft expand` / `replace`, by the CLI's preflight, before any
work: :func:`vocgraft.preflight.choose_init`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vocgraft.init import Method, get_method, method_options

# a method setting the recipe reads itself: a method that declares it may ask for a model with its own LM head
UNTIE_HEAD = "untie_head"


@dataclass(frozen=True)
class ChosenMethod:
    method: Method
    options: dict[str, Any]  # every setting of the method: its defaults overridden by the given ones
    # the user inputs given for it by path ({"target_plm": DIR}), as the manifest records them
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def runs_model(self) -> bool:
        """The method runs the source model (forward passes), so it needs the model loaded."""
        return "model" in self.method.needs

    @property
    def unties_head(self) -> bool:
        return bool(self.options.get(UNTIE_HEAD))


def choose(name: str | ChosenMethod, options: dict[str, Any] | None = None) -> ChosenMethod:
    """``name``'s method and settings (``options``: given values, None = the default); a ChosenMethod is kept."""
    if isinstance(name, ChosenMethod):
        if options:
            raise ValueError("settings go into choose() with the method's name, not beside a ChosenMethod.")
        return name
    return ChosenMethod(get_method(name), method_options(name, options))
