"""Every user setting of every stage, declared once (issue 33).

A stage module (tokenizer, adapt, train, vocadt, eval, export, run) lists its settings as :class:`Setting`\\s: name,
type, default, help, range or choices, flag and YAML key. From those:

- the command line's flags (:mod:`vocgraft.settings.flags`, used by :mod:`vocgraft.cli`);
- the pipeline config's keys, defaults and checks (:data:`SECTIONS`, :mod:`vocgraft.settings.schema`);
- preflight's range rules (:func:`rules`, ``preflight.RULES``);
- ``key=value`` overrides of `vocgraft run` / `sweep` (:mod:`vocgraft.settings.overrides`);
- :class:`vocgraft.train.lapt.TrainConfig`'s defaults.

Init methods declare their own settings beside their code (:mod:`vocgraft.init`); they join the ``adapt`` section
and the expand/replace flags from there. To add a setting: add it to its stage here, then read it where it acts.
"""

from __future__ import annotations

import functools

from vocgraft.settings import adapt, evaluation, export, run, tokenizer, train, vocadt
from vocgraft.settings.setting import Rule, Setting, Stage

STAGES: tuple[Stage, ...] = (
    tokenizer.TOKENIZER,
    adapt.EXPAND,
    adapt.REPLACE,
    train.TRAIN,
    vocadt.VOCADT,
    evaluation.EVAL,
    evaluation.LM_EVAL_TASK,
    evaluation.DOWNSTREAM,
    export.EXPORT_GGUF,
    run.SWEEP,
    run.PLM,
)
# the pipeline config: "" is the top level; adapt.vocadt is a section inside adapt
SECTIONS: dict[str, tuple[Setting, ...]] = {
    "": run.TOP,
    "adapt": adapt.ADAPT_SECTION,
    "adapt.vocadt": vocadt.SECTION,
    "train": train.TRAIN_SECTION,
    "eval": evaluation.EVAL_SECTION,
    "report": run.REPORT_SECTION,
}


def stage(name: str) -> Stage:
    return next(s for s in STAGES if s.name == name)


def every_setting() -> list[Setting]:
    """Each declared setting once per place it is offered (stages, then sections)."""
    return [s for st in STAGES for s in st] + [s for section in SECTIONS.values() for s in section]


@functools.cache
def rules() -> dict[str, Rule]:
    """name -> range rule of every declared setting: preflight checks parsed flags by these names. A name has one
    rule wherever it is offered (a ValueError here is a declaration to fix)."""
    found: dict[str, Rule] = {}
    for setting in every_setting():
        if setting.rule is None:
            continue
        if setting.name in found and found[setting.name][1] != setting.rule[1]:
            raise ValueError(f"setting {setting.name} has two ranges: {found[setting.name][1]} / {setting.rule[1]}")
        found.setdefault(setting.name, setting.rule)
    return found
