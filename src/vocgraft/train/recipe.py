"""LAPT recipes: named presets of the settings that make a run, so that one name gives the papers' LAPT.

- ``papers`` (the default of ``vocgraft train`` and of a pipeline's ``train`` section): 2x2 layers + embeddings +
  head, CLM + MTP, 2 epochs, lr 1e-4 with a cosine schedule, 100 warmup updates (a run of fewer than 1,000 updates
  warms up over its first 10%, at least 1), weight decay 0.01, batch 8 x 512 tokens (paper 000 Table 3; paper 003
  §6.6 and Table 6).
- ``quick``: LoRA + CLM for 100 updates, otherwise as ``papers`` (``recipe: quick``, ``--recipe quick``).

A setting given explicitly wins over the recipe's; a budget given (epochs, max_steps or max_tokens) replaces the
recipe's budget as a whole, so ``--recipe papers --max-steps 500`` trains 500 updates, not 2 epochs. The budgets
that do not decide are None, so a filled-in section names one budget and can be filled in again.
"""

from __future__ import annotations

from vocgraft.settings.train import DEFAULT_RECIPE  # noqa: F401 (re-exported; declared with the recipe setting)
from vocgraft.train.data import TrainingError

# the settings a recipe decides
RECIPE_KEYS = (
    "strategy", "objective", "seq_len", "batch_size", "epochs", "max_steps", "max_tokens", "lr", "warmup_steps",
    "weight_decay",
)  # fmt: skip
BUDGET_KEYS = ("epochs", "max_steps", "max_tokens")  # one of them decides the number of updates
DEFAULT_EPOCHS = 2.0
PAPERS = {
    "strategy": "2x2", "objective": "mtp", "seq_len": 512, "batch_size": 8, "epochs": DEFAULT_EPOCHS,
    "max_steps": None, "max_tokens": None, "lr": 1e-4, "warmup_steps": 100, "weight_decay": 0.01,
}  # fmt: skip
RECIPES: dict[str, dict] = {
    "papers": PAPERS,
    "quick": {**PAPERS, "strategy": "lora", "objective": "clm", "epochs": None, "max_steps": 100},
}


def with_recipe(name: str, settings: dict, where: str = "--recipe") -> dict:
    """``settings`` with each recipe setting that is None (not given) taken from recipe ``name``."""
    if name not in RECIPES:
        raise TrainingError(f"{where} {name!r} is not a recipe; choose one of {', '.join(RECIPES)}.")
    preset = dict(RECIPES[name])
    if any(settings.get(key) is not None for key in BUDGET_KEYS):  # the user's budget, not the recipe's
        preset.update(dict.fromkeys(BUDGET_KEYS))
    filled = {key: preset[key] for key in RECIPE_KEYS if settings.get(key) is None}
    return {**settings, **filled}
