"""Pipeline configuration: a YAML file, checked against a schema so that a typo fails before any work.

    model: smollm2
    corpus: ../shared/corpora/el/train.txt
    heldout: ../shared/corpora/el/heldout.txt
    lang: el
    out: runs/el
    sample: 8192                 # corpus lines for the tokenizer and the initialization
    adapt: {mode: expand, new_tokens: 1000, init: align}      # mode: expand | replace | vocadt
    train: {recipe: quick, max_steps: 50, batch_size: 2}       # optional
    eval: {limit: 200, mt: ../shared/corpora/parallel/en-el.tsv}
    report: {tolerance: 0.02}    # source_lapt: true (with train: the source + the same LAPT is the reference)
    device: auto                 # auto (a GPU when there is one) | cpu | cuda | cuda:N
    dtype: auto                  # auto (as the source stores it) | bfloat16 | float16 | float32

Relative paths are relative to the directory the command runs in. ``device`` and ``dtype`` apply to every stage
that loads a model; ``adapt``, ``train`` and ``eval`` may each set their own (``train: {dtype: bfloat16}``).
``adapt.dtype`` is the dtype the adapted model is saved in; ``adapt.surgery`` (auto | shards | full) picks how it is
edited (auto: on its safetensors files without loading it, when the init method needs no forward pass);
``train.mixed_precision`` (auto | no | bf16 | fp16) and ``train.gradient_checkpointing`` are LAPT's.
``train.recipe`` fills in the LAPT settings the section leaves out: ``papers`` (the default, as `vocgraft
train`'s: 2x2 + MTP, 2 epochs, lr 1e-4 cosine, warmup 100) or ``quick`` (LoRA + CLM for 100 updates);
``train.join`` (newline | eos | none) is what joins corpus lines in training sequences, ``train.new_rows_lr_scale``
the new vocabulary rows' learning rate as a multiple of ``lr``. ``adapt.mode: vocadt`` trains VocADT's adapters in
the adapt stage, with the settings of ``adapt.vocadt`` (``{alpha: 0.1, max_steps: 50, lr: 3e-4}``); ``adapt.init``
is then not used.

Every key, its type, default and range is declared once in :mod:`vocgraft.settings`, where the command line's flags
come from too; ``vocgraft run CONFIG train.lr=3e-4 eval.limit=50`` overrides keys (:func:`load_config`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from vocgraft.errors import UserError
from vocgraft.settings import SECTIONS
from vocgraft.settings.run import REQUIRED as TOP_REQUIRED
from vocgraft.settings.schema import REQUIRED, problems, section_schema

OPTIONAL_SECTIONS = {"train"}  # absent = that stage is skipped
PLACED_SECTIONS = ("adapt", "train", "eval")  # sections that may override the top-level device and dtype


def base_schema() -> dict[str, Any]:
    """key -> (type(s), default), a dict value being a nested section: every key from the settings' declarations
    (:data:`vocgraft.settings.SECTIONS`)."""
    full = section_schema(SECTIONS[""], TOP_REQUIRED)
    for name, settings in SECTIONS.items():
        if name:
            *outer, inner = name.split(".")
            holder = full[outer[0]] if outer else full
            holder[inner] = section_schema(settings)
    return full


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
        kinds = types if isinstance(types, tuple) else (types,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            wanted = " or ".join(t.__name__ for t in kinds)
            raise ConfigError(f"{source}: {name} must be {wanted}; got {shown(value)}.")
        out[key] = value
    return out


def schema() -> dict:
    """SCHEMA plus, under ``adapt``, every init method's user inputs and settings (from the method registry)."""
    from vocgraft.init import all_options
    from vocgraft.recipes.common import USER_INPUTS

    full = base_schema()
    full["adapt"] |= {name: (str, None) for name in USER_INPUTS}
    full["adapt"] |= {o.name: ((int, float) if o.type is float else o.type, None) for o in all_options().values()}
    return full


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
    _one_budget(config["adapt"]["vocadt"], "adapt.vocadt", source)
    adapt = config["adapt"]
    from vocgraft.init import METHODS

    if adapt["init"] not in METHODS:
        raise ConfigError(f"{source}: adapt.init {adapt['init']!r} is not a method; choose from {sorted(METHODS)}.")
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


def _one_budget(section: dict, where: str, source: str) -> None:
    budgets = [key for key in ("epochs", "max_steps", "max_tokens") if section[key] is not None]
    if len(budgets) > 1:
        raise ConfigError(f"{source}: {where}.{budgets[0]} and {where}.{budgets[1]} are two budgets; give one of them.")


def _with_recipe(train: dict, source: str) -> dict:
    """The train section with its recipe's values for the settings it leaves unset; one budget at most."""
    from vocgraft.train.data import TrainingError
    from vocgraft.train.recipe import with_recipe

    _one_budget(train, "train", source)
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
    """A device that is not there fails now, not when its stage starts; named by the config's key."""
    from vocgraft.devices import DeviceError, resolve_device

    for where, section in [("", config), *((f"{name}.", config[name]) for name in PLACED_SECTIONS)]:
        if section is not None and section.get("device") is not None:
            try:
                resolve_device(section["device"])
            except DeviceError as exc:
                raise ConfigError(f"{source}: {str(exc).replace('--device', f'{where}device')}") from None


def check_values(config: dict, source: str) -> None:
    """Ranges and choices of a validated config, as its settings declare them (the same as the flags'), and its
    script list, before any stage runs."""
    from vocgraft.preflight import ArgumentError, check_scripts

    for name, settings in SECTIONS.items():
        section = config
        for part in filter(None, name.split(".")):
            section = section.get(part) if section is not None else None
        found = problems(settings, section, f"{name}." if name else "")
        if found:
            raise ConfigError(f"{source}: {found[0]}.")
    try:
        check_scripts(config["adapt"]["scripts"], "adapt.scripts")
    except ArgumentError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | Path, overrides: list[str] = ()) -> dict:
    """The validated config of a YAML file, with ``overrides`` (``train.lr=3e-4``, typed by the declarations)
    applied before it is checked."""
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
    raw = raw or {}
    if overrides and isinstance(raw, dict):  # not a mapping: validate says so
        from vocgraft.settings.overrides import OverrideError, apply_overrides

        try:
            raw = apply_overrides(raw, list(overrides), schema())
        except OverrideError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return validate(raw, str(path), config_file=path)
