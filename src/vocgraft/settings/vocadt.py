"""VocADT (paper 004): replace the tokenizer and learn the new embeddings as adapters over the frozen model.

It is a method that trains, so it is not an init method (:mod:`vocgraft.init`); ``vocgraft methods`` lists it after
them, from :data:`METHOD`. It runs as `vocgraft vocadt` (the LAPT flags without a recipe: VocADT trains its adapters
with its own strategy and the CLM objective) and in a pipeline as ``adapt.mode: vocadt``, whose ``adapt.vocadt``
section holds the settings below. Code: :mod:`vocgraft.recipes.vocadt` (the recipe), :mod:`vocgraft.train.vocadt`
(adapters, start rows, aux loss).
"""

from __future__ import annotations

from dataclasses import dataclass

from vocgraft.settings import common as c
from vocgraft.settings import train as t
from vocgraft.settings.setting import Setting, Stage, at_least_1, lazy, non_negative

# adapter weights are mixing coefficients around 1/m; on SmolLM2 + Greek (10 steps of 2 x 512 tokens) validation
# loss 10.96 fell to 9.52 / 8.22 / 9.41 at lr 1e-4 / 3e-4 / 1e-3 and diverged at 1e-2
VOCADT_LR = 3e-4
# measured in benchmarks/results/vocadt.md (SmolLM2, el and hi, same budget): see README
DEFAULT_ADAPTERS = "separate"
FORM = "form"  # --max-candidates K (sparse) or --dense

ALPHA = Setting(
    "alpha", float, 0.1, "aux-loss weight keeping shared tokens' rows near their start (paper 004: 0.1 for non-Latin "
    "scripts, 0 for Latin)", rule=non_negative(1e6),
)  # fmt: skip
MAX_CANDIDATES = Setting(
    "max_candidates", int, 64, "K nearest old rows per new row (sparse form)", rule=at_least_1(1 << 16), group=FORM
)
DENSE = Setting("dense", bool, False, "a full |Vnew| x |Vold| adapter (large GPUs only)", group=FORM)
ADAPTERS = Setting(
    "adapters", str, DEFAULT_ADAPTERS, "separate input and output adapters (paper 004's form; a tied source is saved "
    "untied) or one adapter on both sides (a tied source stays tied)",
    choices=lazy("vocgraft.train.vocadt", "ADAPTER_FORMS"),
)  # fmt: skip
OWN = (ALPHA, MAX_CANDIDATES, DENSE, ADAPTERS)


@dataclass(frozen=True)
class Method:
    """What `vocgraft methods` shows of a method that is not an init method."""

    name: str
    summary: str
    reference: str
    settings: tuple[Setting, ...]
    runs_as: str
    section: str  # the pipeline section that holds its settings

    def describe(self) -> str:
        """What `vocgraft methods` says of it, after the init methods: where it is defined, how it runs, each
        setting's flag and pipeline key."""
        lines = [f"{self.name} (trains; not an --init method): {self.summary}", f"  defined in: {self.reference}"]
        lines.append(f"  runs as: {self.runs_as}")
        for setting in self.settings:
            where = f"{setting.cli_flag} / {self.section}.{setting.yaml_key}"
            lines.append(f"  {where} (default {setting.default}): {setting.help_text()}")
        return "\n".join(lines)


def training_defaults() -> dict:
    """VocADT's training settings: the papers' recipe values (it has no recipe) with its own learning rate."""
    return {**{k: v for k, v in t.PAPERS.items() if k in TRAINING_NAMES}, "lr": VOCADT_LR}


def training_settings(section: dict) -> dict:
    """The adapter training's TrainConfig settings from a pipeline's ``adapt.vocadt``: each one left unset (None)
    takes :func:`training_defaults`; a budget given replaces the default budget (epochs) as a whole."""
    defaults = training_defaults()
    if any(section.get(s.name) is not None for s in TRAINING if s.group == t.BUDGET):
        defaults.update({s.name: None for s in TRAINING if s.group == t.BUDGET})
    names = (*TRAINING_NAMES, t.MIXED.name, t.GRADIENT_CHECKPOINTING.name)
    return {name: section[name] if section.get(name) is not None else defaults.get(name) for name in names}


# the LAPT settings that make sense for adapter training (no recipe, strategy or objective: VocADT's own)
TRAINING = tuple(s for s in t.SCHEDULE if s.name not in t.RECIPE_ONLY)
TRAINING_NAMES = tuple(s.name for s in TRAINING)
TARGET = (
    Setting("tokenizer", str, None, "the target tokenizer (default: train one on the --corpus mix)", key=None),
    c.KIND.but(help="kind of the trained tokenizer"),
    c.VOCAB_SIZE,
)

VOCADT = Stage(
    "vocadt",
    (*t.CLI_ONLY, *TRAINING, *t.RUN_CONTROL, c.DEVICE, t.TRAIN_DTYPE, t.MIXED, t.GRADIENT_CHECKPOINTING, *TARGET, *OWN),
    summary="replace the tokenizer; learn new embeddings as adapters over the frozen model (VocADT)",
)
# adapt.vocadt in a pipeline: its own settings and the adapter training's (the pipeline's target tokenizer is
# adapt.vocab_size's, trained in the tokenizer stage as for replace)
SECTION = (*OWN, *TRAINING, t.MIXED, t.GRADIENT_CHECKPOINTING)

METHOD = Method(
    "vocadt",
    "replace the tokenizer and train each new row as a learned mix of old rows (adapters over the frozen model)",
    "vocgraft/recipes/vocadt.py (paper 004: VocADT)",
    OWN,
    "`vocgraft vocadt`, or `adapt: {mode: vocadt}` in a pipeline config",
    "adapt.vocadt",
)
