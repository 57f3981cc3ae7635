"""`vocgraft run` / `sweep`: the pipeline config's top-level keys and its ``report`` section, and the sweep's flags;
`vocgraft plm train`, which the pipeline does not run, is here too."""

from __future__ import annotations

from vocgraft.settings import common as c
from vocgraft.settings.setting import Setting, Stage, at_least_1, positive, rule

# top-level keys of a pipeline config; REQUIRED: no default
REQUIRED = ("corpus", "heldout", "out")
TOP = (
    c.MODEL,
    c.CORPUS,
    Setting("heldout", str, None, "held-out text for every measurement"),
    Setting("lang", str, None, "target language code (prompt templates, MT language name)"),
    c.OUT.but(help="the run folder: stages, report.md, plots"),
    c.SEED,
    c.SAMPLE.but(help="corpus lines for the tokenizer and the initialization"),
    c.DEVICE,
    c.DTYPE,
)
TOLERANCE = Setting(
    "tolerance", float, 0.02, "allowed relative bits/byte loss vs the source",
    rule=rule(lambda v: isinstance(v, int | float) and 0 <= v <= 1, "a fraction between 0 and 1 (0.02 = 2%)"),
)  # fmt: skip
REPORT_SECTION = (
    TOLERANCE,
    # with a train section: also train the source with the same LAPT and judge trained models against it
    Setting("source_lapt", bool, True, "train the source with the same LAPT and judge trained models against it"),
)

SWEEP = Stage(
    "sweep",
    (
        Setting("k", str, None, "new-token counts, e.g. 50,100,500,1000,5000"),
        Setting("init", str, None, "init methods, e.g. random,mean,align"),
        Setting("sizes", str, None, "LAPT corpus sizes |D|, e.g. 2^10..2^15 (needs a train section)"),
        TOLERANCE.but(
            default=None,
            help=f"allowed relative bits/byte loss vs the source (default: the config's, else {TOLERANCE.default})",
        ),
        Setting("jobs", int, 1, "settings run in parallel processes", rule=at_least_1(1024)),
    ),
    summary="the pipeline over k x init (x |D|), with report.md, plots and a recommendation",
)

MINUTES = Setting("minutes", float, 5.0, "time budget", rule=positive(1e6))
PLM = Stage(
    "plm train",
    (
        c.CORPUS,
        Setting("tokenizer", str, None, "the target tokenizer (a directory)", required=True),
        c.OUT,
        MINUTES,
        # `plm train --steps 0` saved an untrained model
        Setting("steps", int, None, "step budget (whichever runs out first)", rule=at_least_1()),
        Setting("max_lines", int, None, rule=at_least_1()),
        c.SEED,
        c.OVERWRITE,
        c.DEVICE,  # a small model trained from scratch: float32, no --dtype
    ),
    summary="train a small GPT-2-style LM from scratch with the target tokenizer",
)
