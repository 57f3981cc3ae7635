"""Pipeline configuration: a YAML file, checked against a schema so that a typo fails before any work.

    model: smollm2
    corpus: ../shared/corpora/el/train.txt
    heldout: ../shared/corpora/el/heldout.txt
    lang: el
    out: runs/el
    sample: 8192                 # corpus lines for the tokenizer and the initialization
    adapt: {mode: expand, new_tokens: 1000, init: align}
    train: {strategy: lora, max_steps: 50, batch_size: 2}      # optional
    eval: {limit: 200, mt: ../shared/corpora/parallel/en-el.tsv}
    report: {tolerance: 0.02}    # source_lapt: true (with train: the source + the same LAPT is the reference)
    device: auto                 # auto (a GPU when there is one) | cpu | cuda | cuda:N
    dtype: auto                  # auto (as the source stores it) | bfloat16 | float16 | float32

Relative paths are relative to the directory the command runs in. ``device`` and ``dtype`` apply to every stage
that loads a model; ``adapt``, ``train`` and ``eval`` may each set their own (``train: {dtype: bfloat16}``).
``adapt.dtype`` is the dtype the adapted model is saved in; ``adapt.surgery`` (auto | shards | full) picks how it is
edited (auto: on its safetensors files without loading it, when the init method needs no forward pass);
``train.mixed_precision`` (auto | no | bf16 | fp16) and ``train.gradient_checkpointing`` are LAPT's.
``train.recipe`` fills in the LAPT settings the section leaves out: ``quick`` (the default: LoRA + CLM for 100
updates) or ``papers`` (2x2 + MTP, 2 epochs, lr 1e-4 cosine, warmup 100); ``train.join`` (newline | eos | none) is
what joins corpus lines in training sequences, ``train.new_rows_lr_scale`` the new vocabulary rows' learning rate
as a multiple of ``lr``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from vocgraft.errors import UserError

REQUIRED = object()
PIPELINE_RECIPE = "quick"  # the train section's recipe when it names none

# key -> (type(s), default); a dict value is a nested section
SCHEMA: dict[str, Any] = {
    "model": (str, "smollm2"),
    "corpus": (str, REQUIRED),
    "heldout": (str, REQUIRED),
    "lang": (str, None),
    "out": (str, REQUIRED),
    "seed": (int, 0),
    "sample": (int, None),
    "device": (str, "auto"),
    "dtype": (str, "auto"),
    "adapt": {
        "mode": (str, "expand"),
        "new_tokens": (int, 100),
        "init": (str, "align"),
        "aux_vocab_size": (int, 16000),
        "vocab_size": (int, 50000),
        "scripts": (str, "auto"),  # auto | any | comma-separated script names (tokenization.scripts)
        "keep_marks": (str, "auto"),  # auto | on | off: combining marks stay with letters (tokenization.marks)
        "protect": (str, None),
        "protect_lines": (int, 8192),
        "surgery": (str, "auto"),
        "device": (str, None),  # None: the top-level value
        "dtype": (str, None),
    },
    "train": {
        # a LAPT recipe (train/recipe.py) fills in the settings below left unset (None): quick (LoRA + CLM for 100
        # updates) or papers (2x2 + MTP, 2 epochs)
        "recipe": (str, PIPELINE_RECIPE),
        "strategy": (str, None),
        "objective": (str, None),
        "seq_len": (int, None),
        "batch_size": (int, None),
        "grad_accum": (int, 1),
        "epochs": ((int, float), None),  # one budget: epochs, max_steps (updates) or max_tokens
        "max_steps": (int, None),
        "max_tokens": (int, None),
        "lr": ((int, float), None),
        "warmup_steps": (int, None),
        "weight_decay": ((int, float), None),
        "join": (str, "newline"),  # newline | eos | none: what joins corpus lines in training sequences
        "new_rows_lr_scale": ((int, float), 1.0),  # the new vocabulary rows' lr, a multiple of lr
        "new_rows_weight_decay": ((int, float), None),  # None: weight_decay
        "stage1_share": ((int, float), 0.5),  # two-stage strategies: the embeddings + head phase's share
        "sample": (int, None),
        "val_lines": (int, 256),
        "mixed_precision": (str, "auto"),
        "gradient_checkpointing": (bool, False),
        "device": (str, None),
        "dtype": (str, None),
    },
    "eval": {
        "limit": (int, 200),
        "max_length": (int, 512),
        "mt": (str, None),
        "mt_limit": (int, 20),
        "shots": (int, 3),
        "prompts": (int, 0),
        "max_new_tokens": (int, 32),
        "nli": (str, None),  # JSONL task files (eval/tasks.py formats), scored with lang's templates
        "sum": (str, None),
        "span": (str, None),
        "device": (str, None),
        "dtype": (str, None),
    },
    "report": {
        "tolerance": ((int, float), 0.02),
        # with a train section: also train the source with the same LAPT and judge trained models against it
        "source_lapt": (bool, True),
    },
}
OPTIONAL_SECTIONS = {"train"}  # absent = that stage is skipped
MODES = ("expand", "replace")
PLACED_SECTIONS = ("adapt", "train", "eval")  # sections that may override the top-level device and dtype
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")


class ConfigError(UserError, ValueError):
    """A pipeline config that cannot run; the message names the file and key."""


def shown(value: Any) -> str:
    """A value as the message shows it: YAML anchors can make a few lines hold 10^9 elements (the "billion laughs"),
    whose full repr never ends."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, 60, 60
    return short.repr(value)


def _check(section: dict, schema: dict, where: str, source: str) -> dict:
    if not isinstance(section, dict):
        what = where.rstrip(".") or "the file"
        raise ConfigError(f"{source}: {what} must be a mapping of keys to values; got {shown(section)}.")
    unknown = sorted(set(section) - set(schema))
    if unknown:
        allowed = ", ".join(sorted(schema))
        raise ConfigError(f"{source}: unknown key '{where}{unknown[0]}'; allowed here: {allowed}.")
    out = {}
    for key, rule in schema.items():
        name = f"{where}{key}"
        if isinstance(rule, dict):
            if key not in section and key in OPTIONAL_SECTIONS:
                out[key] = None
                continue
            out[key] = _check(section.get(key) or {}, rule, f"{name}.", source)
            continue
        types, default = rule
        if key not in section or section[key] is None:
            if default is REQUIRED:
                raise ConfigError(f"{source}: missing required key {name!r}.")
            out[key] = default
            continue
        value = section[key]
        if (isinstance(value, bool) and types is not bool) or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            raise ConfigError(f"{source}: {name} must be {wanted}; got {shown(value)}.")
        out[key] = value
    return out


def schema() -> dict:
    """SCHEMA plus, under ``adapt``, every init method's user inputs and settings (from the method registry)."""
    from vocgraft.init import all_options
    from vocgraft.recipes.common import USER_INPUTS

    full = {key: dict(rule) if isinstance(rule, dict) else rule for key, rule in SCHEMA.items()}  # REQUIRED stays
    full["adapt"] |= {name: (str, None) for name in USER_INPUTS}
    full["adapt"] |= {o.name: ((int, float) if o.type is float else o.type, None) for o in all_options().values()}
    return full


def method_args(adapt: dict) -> dict:
    """The init method's user inputs and settings from a validated ``adapt`` section: only those the method
    reads (a sweep's config may carry settings for its other methods)."""
    from vocgraft.init import get_method
    from vocgraft.recipes.common import USER_INPUTS

    method = get_method(adapt["init"])
    return {
        "method_inputs": {name: adapt[name] for name in USER_INPUTS if name in method.needs},
        "options": {option.name: adapt[option.name] for option in method.options},
    }


def check_methods(adapt: dict, inits: list[str], source: str = "config") -> None:
    """Before any work: every method of ``inits`` has the inputs it needs, and every input or setting the
    ``adapt`` section gives is read by at least one of them (otherwise it would be silently ignored)."""
    from vocgraft.init import INPUTS, METHODS, all_options
    from vocgraft.recipes.common import USER_INPUTS

    unknown = [i for i in inits if i not in METHODS]
    if unknown:
        raise ConfigError(f"{source}: init {unknown[0]!r} is not a method; choose from {sorted(METHODS)}.")
    methods = [METHODS[i] for i in inits]
    for method in methods:
        for name in USER_INPUTS:
            if name in method.needs and not adapt[name]:
                raise ConfigError(f"{source}: init method {method.name!r} needs {INPUTS[name]}; set adapt.{name}.")
    settings = [name for name in USER_INPUTS if adapt[name]] + [
        name for name in all_options() if adapt[name] is not None
    ]
    for name in settings:
        if not any(name in m.needs or name in {o.name for o in m.options} for m in methods):
            raise ConfigError(
                f"{source}: adapt.{name} is not read by init {', '.join(inits)}; remove it or add a method that "
                "reads it."
            )


def validate(raw: dict, source: str = "config", config_file: str | Path | None = None) -> dict:
    """The config with every default filled in; ConfigError on unknown keys, wrong types or missing keys, or an
    ``out`` that is or holds an input, or is someone else's folder."""
    raw = copy.deepcopy(raw)
    adapt = raw.get("adapt") if isinstance(raw, dict) else None
    if isinstance(adapt, dict) and isinstance(adapt.get("keep_marks"), bool):
        # YAML 1.1 reads the README's own `keep_marks: on` (and off) as a boolean
        adapt["keep_marks"] = "on" if adapt["keep_marks"] else "off"
    config = _check(raw, schema(), "", source)
    if config["train"] is not None:
        config["train"] = _with_recipe(config["train"], source)
    adapt = config["adapt"]
    if adapt["mode"] not in MODES:
        raise ConfigError(f"{source}: adapt.mode must be one of {', '.join(MODES)}; got {adapt['mode']!r}.")
    from vocgraft.init import METHODS

    if adapt["init"] not in METHODS:
        raise ConfigError(f"{source}: adapt.init {adapt['init']!r} is not a method; choose from {sorted(METHODS)}.")
    from vocgraft.tokenization.marks import KEEP_MARKS_SETTINGS

    if adapt["keep_marks"] not in KEEP_MARKS_SETTINGS:
        raise ConfigError(
            f"{source}: adapt.keep_marks must be one of {', '.join(KEEP_MARKS_SETTINGS)}; got {adapt['keep_marks']!r}."
        )
    if adapt["new_tokens"] <= 0:
        raise ConfigError(f"{source}: adapt.new_tokens must be positive; got {adapt['new_tokens']}.")
    from vocgraft.init import MethodInputError, all_options

    for option in all_options().values():  # the ranges and choices each setting declares
        try:
            option.check(adapt[option.name], f"adapt.{option.name}")
        except MethodInputError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    _check_placement(config, source)
    check_values(config, source)
    named = {key: config[key] for key in ("corpus", "heldout")}
    named |= {f"eval.{key}": config["eval"][key] for key in ("mt", "nli", "sum", "span") if config["eval"][key]}
    for key, value in named.items():
        if not Path(value).exists():
            raise ConfigError(f"{source}: {key} {value!r} does not exist (paths are relative to where you run).")
        if key.startswith("eval.") and not Path(value).is_file():  # read whole as a file, after the other stages
            raise ConfigError(f"{source}: {key} {value!r} is not a file; give the path of its file.")
    from vocgraft.corpus import CorpusError
    from vocgraft.errors import OutputExistsError
    from vocgraft.outdir import check_output_path
    from vocgraft.ownership import check_run_folder
    from vocgraft.preflight import check_text_file

    try:
        for key in ("corpus", "heldout"):
            check_text_file(config[key], key)
        check_output_path(config["out"], "out")
        check_run_folder(config["out"], "out", run_inputs(config, config_file))
    except (CorpusError, OutputExistsError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


def _with_recipe(train: dict, source: str) -> dict:
    """The train section with its recipe's values for the settings it leaves unset; one budget at most."""
    from vocgraft.train.data import TrainingError
    from vocgraft.train.recipe import with_recipe

    budgets = [key for key in ("epochs", "max_steps", "max_tokens") if train[key] is not None]
    if len(budgets) > 1:
        raise ConfigError(f"{source}: train.{budgets[0]} and train.{budgets[1]} are two budgets; give one of them.")
    try:
        return with_recipe(train["recipe"], train, "train.recipe")
    except TrainingError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def run_inputs(config: dict, config_file: str | Path | None = None) -> list:
    """(key, path) of every input of a validated config that exists on disk (the config file itself too)."""
    from vocgraft.ownership import existing
    from vocgraft.recipes.common import USER_INPUTS

    named = [(key, config[key]) for key in ("model", "corpus", "heldout")]
    named += [(f"adapt.{key}", config["adapt"][key]) for key in ("protect", *USER_INPUTS)]
    named += [(f"eval.{key}", config["eval"][key]) for key in ("mt", "nli", "sum", "span")]
    return existing([*named, ("the config", config_file)])


def placement(config: dict, section: str) -> tuple[str, str]:
    """(device, dtype) of a stage: the section's own, else the top-level values."""
    own = config.get(section) or {}
    device = own.get("device") or config["device"]
    dtype = own.get("dtype") or config["dtype"]
    return device, dtype


def _check_placement(config: dict, source: str) -> None:
    from vocgraft.devices import DTYPE_CHOICES, DeviceError, resolve_device
    from vocgraft.recipes.common import SURGERY_PATHS

    for where, section in [("", config), *((f"{name}.", config[name]) for name in PLACED_SECTIONS)]:
        if section is not None and section.get("dtype") is not None and section["dtype"] not in DTYPE_CHOICES:
            choices = ", ".join(DTYPE_CHOICES)
            raise ConfigError(f"{source}: {where}dtype must be one of {choices}; got {section['dtype']!r}.")
        if section is not None and section.get("device") is not None:
            try:  # a device that is not there fails now, not when its stage starts; named by the config's key
                resolve_device(section["device"])
            except DeviceError as exc:
                raise ConfigError(f"{source}: {str(exc).replace('--device', f'{where}device')}") from None
    if config["adapt"]["surgery"] not in SURGERY_PATHS:
        raise ConfigError(f"{source}: adapt.surgery must be one of {', '.join(SURGERY_PATHS)}.")
    if config["train"] is not None and config["train"]["mixed_precision"] not in MIXED_PRECISION:
        raise ConfigError(f"{source}: train.mixed_precision must be one of {', '.join(MIXED_PRECISION)}.")


# section.key -> (test, what it must be): the ranges the CLI's flags have (preflight.RULES), for the YAML keys
def _ranges() -> dict[str, tuple]:
    from vocgraft.preflight import MAX_COUNT, RULES

    return {
        "seed": RULES["seed"],
        "sample": RULES["sample"],
        "adapt.aux_vocab_size": RULES["aux_vocab_size"],
        "adapt.vocab_size": RULES["vocab_size"],
        "adapt.protect_lines": RULES["max_lines"],
        **{
            f"train.{key}": RULES[key]
            for key in (
                "seq_len",
                "batch_size",
                "grad_accum",
                "epochs",
                "max_steps",
                "max_tokens",
                "lr",
                "warmup_steps",
                "weight_decay",
                "new_rows_lr_scale",
                "new_rows_weight_decay",
                "stage1_share",
            )
        },  # fmt: skip
        "train.sample": RULES["sample"],
        "train.val_lines": RULES["val_lines"],
        "eval.limit": RULES["limit"],
        "eval.max_length": RULES["max_length"],
        "eval.mt_limit": RULES["mt_limit"],
        "eval.shots": RULES["shots"],
        "eval.prompts": (lambda v: 0 <= v <= MAX_COUNT, f"at least 0 and at most {MAX_COUNT:,}"),
        "eval.max_new_tokens": RULES["max_new_tokens"],
        "adapt.new_tokens": RULES["new_tokens"],
        "report.tolerance": RULES["tolerance"],
    }


def check_values(config: dict, source: str) -> None:
    """Ranges, names and script lists of a validated config, before any stage runs."""
    from vocgraft.preflight import ArgumentError, check_scripts
    from vocgraft.train.data import JOINS
    from vocgraft.train.objectives import OBJECTIVES
    from vocgraft.train.strategies import STRATEGIES

    for name, (test, wanted) in _ranges().items():
        section, _, key = name.rpartition(".")
        holder = config[section] if section else config
        if holder is None or holder.get(key) is None:
            continue
        if not test(holder[key]):
            raise ConfigError(f"{source}: {name} must be {wanted}; got {holder[key]}.")
    train = config["train"]
    if train is not None:
        for key, allowed in (("strategy", STRATEGIES), ("objective", OBJECTIVES), ("join", JOINS)):
            if train[key] not in allowed:
                raise ConfigError(f"{source}: train.{key} {train[key]!r} is not one of {', '.join(allowed)}.")
    try:
        check_scripts(config["adapt"]["scripts"], "adapt.scripts")
    except ArgumentError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | Path) -> dict:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file.")
    from vocgraft.corpus import CorpusError, check_regular, read_utf8

    try:
        check_regular(path, "config")
        raw = yaml.safe_load(read_utf8(path))
    except CorpusError as exc:  # a stream, or not UTF-8 text: named as a corpus would be
        raise ConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}).") from None
    return validate(raw or {}, str(path), config_file=path)
