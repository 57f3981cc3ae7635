"""Issue 33: every stage's settings are declared once (vocgraft.settings); the flags, the pipeline's keys, the range
checks and TrainConfig read that declaration; `run`/`sweep` take typed key=value overrides; VocADT is a listed
method the pipeline runs (adapt.mode: vocadt)."""

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from tiny import lines, tiny_source_dir

from vocgraft import settings
from vocgraft.cli import build_parser, main
from vocgraft.pipeline.config import ConfigError, base_schema, load_config, validate
from vocgraft.settings.schema import REQUIRED

# where a command keeps another default than the declaration, and why (anything else is drift)
COMMAND_DEFAULTS = {
    "vocadt": lambda: __import__("vocgraft.settings.vocadt", fromlist=["x"]).training_defaults(),  # no recipe
}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """'expand', 'tokenizer train', 'export gguf', ...: every (sub)command's parser by the words that pick it."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found |= {f"{name} {inner}": p for inner, p in subparsers(sub).items()}
    return found


def method_dests() -> set[str]:
    from vocgraft.init import all_options
    from vocgraft.recipes.common import USER_INPUTS

    return set(USER_INPUTS) | set(all_options())  # declared with each init method (vocgraft.init)


@pytest.mark.parametrize("stage", settings.STAGES, ids=lambda s: s.name)
def test_every_flag_of_a_stage_is_its_declared_setting(stage):
    parser = subparsers(build_parser())[stage.name]
    own = COMMAND_DEFAULTS.get(stage.name, dict)()
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    flagged = {s.name: s for s in stage if s.cli_flag}
    assert set(actions) - method_dests() == set(flagged), "a flag that is not declared, or a declared one not offered"
    for name, setting in flagged.items():
        action = actions[name]
        assert action.option_strings[0] == setting.cli_flag and tuple(action.option_strings[1:]) == setting.aliases
        assert action.required == setting.required
        if not setting.required:
            assert action.default == own.get(name, setting.default), name
        allowed = setting.allowed()
        assert (list(action.choices) if action.choices else None) == (list(allowed) if allowed else None), name
        if setting.type is not bool and not setting.action:
            assert action.type is setting.type, name


def test_every_pipeline_key_is_a_declared_setting_with_its_default():
    schema = base_schema()
    for section, declared in settings.SECTIONS.items():
        holder = schema
        for part in filter(None, section.split(".")):
            holder = holder[part]
        keys = {k: rule for k, rule in holder.items() if not isinstance(rule, dict)}
        assert set(keys) == {s.yaml_key for s in declared}, section
        for setting in declared:
            types, default = keys[setting.yaml_key]
            assert types == setting.types()
            assert default is REQUIRED or default == setting.default, f"{section}.{setting.yaml_key}"


def test_one_default_per_setting_across_commands_and_the_pipeline():
    """A name offered by several commands and pipeline sections has one default; the exceptions say why."""
    # None: "the top-level value" (a section's device/dtype) or "the config's" (sweep --tolerance)
    inherit = {("adapt", "device"), ("adapt", "dtype"), ("train", "device"), ("train", "dtype"), ("eval", "device"),
               ("eval", "dtype"), ("sweep", "tolerance")}  # fmt: skip
    # a name with another meaning in one place: sweep --init is a list of methods, eval --batch-size a budget of
    # windows per forward pass (not LAPT's sequences); required flags have no default on the command line
    other_meaning = {("sweep", "init"), ("eval", "batch_size"), ("lm-eval-task", "batch_size")}
    defaults: dict[str, set] = {}
    places = [(st.name, s) for st in settings.STAGES for s in st]
    places += [(section or "top", s) for section, declared in settings.SECTIONS.items() for s in declared]
    for place, setting in places:
        if (place, setting.name) in inherit | other_meaning or setting.required:
            continue
        defaults.setdefault(setting.name, set()).add(json.dumps(setting.default))
    drifting = {name: found for name, found in defaults.items() if len(found) > 1}
    assert not drifting
    # the drifts issue 33 found, now one value each
    schema = base_schema()
    parsers = subparsers(build_parser())
    downstream = parsers["downstream"].parse_args(["--model", "m", "--lang", "el", "--mt", "x"])
    assert schema["eval"]["mt_limit"][1] == downstream.mt_limit == 50
    assert schema["eval"]["max_new_tokens"][1] == downstream.max_new_tokens == 64
    assert schema["train"]["recipe"][1] == parsers["train"].get_default("recipe") == "papers"
    # --vocab-size and --aux-vocab-size: see test_one_vocab_size_declaration_feeds_every_user


def source_numbers(value: int) -> list[str]:
    """Where ``value`` is written as a number in vocgraft's code (not in a comment, string or docstring)."""
    import io
    import tokenize

    import vocgraft

    root = Path(vocgraft.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
        found += [f"{path.relative_to(root)}:{t.start[0]}" for t in tokens
                  if t.type == tokenize.NUMBER and t.string.replace("_", "") == str(value)]  # fmt: skip
    return found


def test_one_vocab_size_declaration_feeds_every_user():
    """The target tokenizer's size (`tokenizer train`, replace, vocadt, adapt.vocab_size) and the auxiliary one's
    (expand, adapt.aux_vocab_size) are declared once: every command, the pipeline and the library's recipes take
    the declaration's default, and the number is written nowhere else in the code."""
    import inspect

    from vocgraft.recipes.expand import ExpandStep, expand_loaded, expand_model
    from vocgraft.recipes.replace import ReplaceStep, replace_loaded, replace_model
    from vocgraft.recipes.vocadt import VocadtSettings
    from vocgraft.settings import adapt, common

    def field(cls, name):
        return next(f.default for f in dataclasses.fields(cls) if f.name == name)

    def parameter(function, name):
        return inspect.signature(function).parameters[name].default

    schema = base_schema()
    parsers = subparsers(build_parser())
    sizes = {
        **{f"vocgraft {c} --vocab-size": parsers[c].get_default("vocab_size")
           for c in ("tokenizer train", "replace", "vocadt")},
        "adapt.vocab_size": schema["adapt"]["vocab_size"][1],
        "ReplaceStep.target_vocab_size": field(ReplaceStep, "target_vocab_size"),
        "replace_model": parameter(replace_model, "target_vocab_size"),
        "replace_loaded": parameter(replace_loaded, "target_vocab_size"),
        "VocadtSettings.vocab_size": field(VocadtSettings, "vocab_size"),
    }  # fmt: skip
    assert {k: v for k, v in sizes.items() if v != common.VOCAB_SIZE.default} == {}
    aux_sizes = {
        "vocgraft expand --aux-vocab-size": parsers["expand"].get_default("aux_vocab_size"),
        "adapt.aux_vocab_size": schema["adapt"]["aux_vocab_size"][1],
        "ExpandStep.aux_vocab_size": field(ExpandStep, "aux_vocab_size"),
        "expand_model": parameter(expand_model, "aux_vocab_size"),
        "expand_loaded": parameter(expand_loaded, "aux_vocab_size"),
    }
    assert {k: v for k, v in aux_sizes.items() if v != adapt.AUX_VOCAB_SIZE.default} == {}
    # the declaration's line only (a second one is a default written twice)
    assert [p.split(":")[0] for p in source_numbers(common.VOCAB_SIZE.default)] == ["settings/common.py"]
    assert [p.split(":")[0] for p in source_numbers(adapt.AUX_VOCAB_SIZE.default)] == ["settings/adapt.py"]


def test_train_config_and_vocadt_settings_default_as_declared():
    from vocgraft.recipes.vocadt import VocadtSettings
    from vocgraft.settings import vocadt
    from vocgraft.settings.train import PAPERS, TRAIN
    from vocgraft.train.lapt import TrainConfig

    config = TrainConfig(model="m", corpus="c", out="o")
    for setting in TRAIN:
        if setting.name in PAPERS:  # the recipe's: the dataclass holds the papers' values
            assert getattr(config, setting.name) == PAPERS[setting.name]
        elif setting.name not in ("model", "corpus", "out", "corpus_weights", "recipe"):
            assert getattr(config, setting.name) == setting.default, setting.name
    # the VocADT recipe's dataclass (recipes/vocadt.py) agrees with the declaration
    fields = {f.name: f.default for f in dataclasses.fields(VocadtSettings)}
    assert fields["alpha"] == vocadt.ALPHA.default and fields["adapters"] == vocadt.ADAPTERS.default
    assert fields["candidates"] == vocadt.MAX_CANDIDATES.default and fields["vocab_size"] == vocadt.c.VOCAB_SIZE.default
    # the packaged model a command uses when given none (the recipes' sizes: test_one_vocab_size_declaration_...)
    from vocgraft.models import DEFAULT_MODEL
    from vocgraft.settings import common

    assert DEFAULT_MODEL == common.MODEL.default == base_schema()["model"][1]


def test_preflight_rules_are_the_declared_ranges():
    from vocgraft.preflight import RULES

    assert RULES == settings.rules()
    # one rule per name wherever it is offered: a second range for a name is refused at declaration time
    for name, (test, wanted) in RULES.items():
        assert wanted and callable(test), name


# ---------------------------------------------------------------- key=value overrides


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    el = lines("el", 340)
    return tiny_source_dir(tmp_path_factory.mktemp("settings"), el=el[:300], heldout=el[300:])


def config_for(root, out, **adapt):
    return {
        "model": str(root / "source"),
        "corpus": str(root / "el.txt"),
        "heldout": str(root / "heldout.txt"),
        "lang": "el",
        "out": str(out),
        "adapt": {"mode": "expand", "new_tokens": 10, "init": "mean", "aux_vocab_size": 600, **adapt},
        "eval": {"limit": 20, "max_length": 64},
    }


def test_key_value_overrides_are_typed_by_the_declaration(workspace, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config_for(workspace, tmp_path / "out")), encoding="utf-8")
    good = ["train.lr=3e-4", "train.max_steps=5", "eval.limit=7", "report.source_lapt=false", "adapt.vocadt.alpha=0",
            "seed=3", "adapt.init=random", "train.gradient_checkpointing=yes", "eval.mt_limit=null"]  # fmt: skip
    config = load_config(path, good)
    assert config["train"]["lr"] == 3e-4 and config["train"]["max_steps"] == 5 and config["train"]["epochs"] is None
    assert config["eval"]["limit"] == 7 and config["report"]["source_lapt"] is False and config["seed"] == 3
    assert config["adapt"]["vocadt"]["alpha"] == 0 and config["adapt"]["init"] == "random"
    assert config["train"]["gradient_checkpointing"] is True and config["eval"]["mt_limit"] == 50  # null: default
    assert load_config(path)["train"] is None  # the file itself is unchanged
    bad = [
        ("train.lrr=1", r"unknown key 'train\.lrr'; valid keys in train: .*train\.lr,"),
        ("trian.lr=1", "'trian' is not a section; sections here: adapt, train, eval, report"),
        ("speed=1", "unknown key 'speed'; valid keys: model, corpus"),
        ("train.max_steps=many", "train.max_steps must be int; got 'many'"),
        ("report.source_lapt=maybe", "report.source_lapt must be bool"),
        ("train.lr", "an override is KEY=VALUE"),
        ("train.lr=-1", r"train\.lr must be > 0"),  # the declared range, as for --lr
        ("train.strategy=sideways", "train.strategy must be one of full, lora"),
    ]
    for item, message in bad:
        with pytest.raises(ConfigError, match=message):
            load_config(path, [item])
    assert main(["run", str(path), "train.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "vocgraft run: error:" in err and "unknown key 'train.lrr'" in err and "train.max_steps" in err
    assert not (tmp_path / "out").exists()
    args = build_parser().parse_args(["sweep", str(path), "train.lr=3e-4", "eval.limit=5", "--k", "5,10"])
    assert (args.overrides, args.k) == (["train.lr=3e-4", "eval.limit=5"], "5,10")


# ---------------------------------------------------------------- VocADT where a newcomer looks


def test_vocgraft_methods_lists_vocadt_with_its_declared_settings(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "vocadt (trains; not an --init method)" in out and "adapt: {mode: vocadt}" in out
    for flag in ("--alpha", "--max-candidates", "--dense", "--adapters"):
        assert flag in out
    assert "adapt.vocadt.alpha (default 0.1)" in out


def test_a_pipeline_runs_vocadt_from_its_config(workspace, tmp_path):
    raw = config_for(workspace, tmp_path / "out", mode="vocadt", vocab_size=700)
    raw["adapt"]["vocadt"] = {"max_candidates": 8, "max_steps": 2, "batch_size": 2, "seq_len": 32, "val_lines": 8,
                              "lr": 0.05}  # fmt: skip
    config = validate(raw)
    assert config["adapt"]["vocadt"]["alpha"] == 0.1  # the declared default
    with pytest.raises(ConfigError, match="adapt.vocadt.epochs and adapt.vocadt.max_steps are two budgets"):
        validate({**raw, "adapt": {**raw["adapt"], "vocadt": {"epochs": 1, "max_steps": 2}}})
    with pytest.raises(ConfigError, match="adapt.vocadt.adapters must be one of separate, shared"):
        validate({**raw, "adapt": {**raw["adapt"], "vocadt": {"adapters": "both"}}})
    from vocgraft.pipeline.run import run_pipeline

    result = run_pipeline(config)
    assert [s["name"] for s in result["stages"]] == ["eval-source", "tokenizer", "adapt", "eval"]
    assert result["init"] == "vocadt" and result["mode"] == "vocadt" and result["new_tokens"] is None
    adapted = Path(next(s for s in result["stages"] if s["name"] == "adapt")["path"])
    manifest = json.loads((adapted / "vocgraft.json").read_text())
    assert manifest["method"]["stage"] == "vocadt" and manifest["training"]["strategy"] == "vocadt"
    assert manifest["training"]["max_steps"] == 2 and manifest["training"]["lr"] == 0.05
    plan = json.loads((adapted / "vocgraft-plan.json").read_text())
    assert result["vocab_size"] == len(plan["target_tokens"])
    assert result["bits_per_byte"] > 0 and result["speedup"] > 0
    assert all(s["reused"] for s in run_pipeline(config)["stages"])  # reused like every stage
