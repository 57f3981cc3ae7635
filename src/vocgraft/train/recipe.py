"""LAPT recipes: :func:`with_recipe` fills in the settings a recipe decides from a named preset.

The presets (``papers``, ``quick``) and the keys they decide are declarations, beside the settings they fill in:
:data:`vocgraft.settings.train.RECIPES`, whose docstring says what each one trains.
"""

from __future__ import annotations

from vocgraft.settings.train import BUDGET_KEYS, RECIPE_KEYS, RECIPES
from vocgraft.train.data import TrainingError


def with_recipe(name: str, settings: dict, where: str = "--recipe") -> dict:
    """``settings`` with each recipe setting that is None (not given) taken from recipe ``name``."""
    if name not in RECIPES:
        raise TrainingError(f"{where} {name!r} is not a recipe; choose one of {', '.join(RECIPES)}.")
    preset = dict(RECIPES[name])
    if any(settings.get(key) is not None for key in BUDGET_KEYS):  # the user's budget, not the recipe's
        preset.update(dict.fromkeys(BUDGET_KEYS))
    filled = {key: preset[key] for key in RECIPE_KEYS if settings.get(key) is None}
    return {**settings, **filled}
