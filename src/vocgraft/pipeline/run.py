"""`vocgraft run config.yaml`: tokenizer -> adapt (expand or replace) -> train (optional) -> eval, with reuse.

Each stage's output lives in ``<out>/stages/<stage>-<key>``, where the key hashes the stage's settings, the content
of its input files and the keys of the stages it reads. A stage whose directory is complete (it holds
``vocgraft-stage.json``, written last) is reused, so a re-run after a crash continues where it stopped and a sweep
shares what its variants have in common (one tokenizer for every k and method; one source evaluation). Stages
are locked while they build (:mod:`vocgraft.locks`), so parallel sweep workers and two runs on one folder never
build the same stage twice: the second waits, saying which process builds it and since when, then reuses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from vocgraft.locks import hold
from vocgraft.outdir import MANIFEST, STAGE_RECORD, atomic_write, write_manifest

STAGE_FILE = STAGE_RECORD


@dataclass
class Stage:
    name: str
    key: str
    path: Path
    reused: bool
    seconds: float


def fingerprint(path: str | Path) -> str:
    """Content hash of a file (or of every file in a folder, by name): a changed corpus is a new stage."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def stage_key(name: str, params: dict) -> str:
    text = json.dumps({"stage": name, **params}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_stage(root: Path, name: str, params: dict, build: Callable[[Path], dict | None]) -> Stage:
    """Reuse ``<root>/stages/<name>-<key>`` if complete; else ``build(path)`` (which must create ``path``, or
    leave it to us) and mark it complete. ``build`` may return facts for the stage file."""
    key = stage_key(name, params)
    path = root / "stages" / f"{name}-{key}"
    # a parallel run (a sweep worker, a second `vocgraft run` on the same folder) building this stage is waited for,
    # with a line naming it, and its stage then reused
    with hold(path, wait=True, what="building"):
        if (path / STAGE_FILE).is_file():
            return Stage(name, key, path, True, 0.0)
        if path.exists():  # a crash after the stage's own rename, before it was marked: build it again
            shutil.rmtree(path)
        start = time.perf_counter()
        facts = build(path) or {}
        seconds = time.perf_counter() - start
        path.mkdir(parents=True, exist_ok=True)
        record = {"stage": name, "key": key, "params": params, "seconds": seconds, "facts": facts}
        atomic_write(path / STAGE_FILE, json.dumps(record, indent=2, default=str) + "\n")  # whole, or absent
    return Stage(name, key, path, False, seconds)


@contextlib.contextmanager
def run_folder(out: str | Path, config: dict) -> Iterator[Path]:
    """The run's folder, marked as vocgraft's (``vocgraft.json``, so ``--overwrite`` may later replace it). A run
    that fails before any stage completes (a device the machine lacks, a bad input) removes the folders it made,
    so it leaves no empty run folder behind; completed stages stay for the next run to reuse."""
    root = Path(out)
    made = None  # the outermost folder this run creates
    for folder in (root, *root.parents):
        if folder.exists():
            break
        made = folder
    root.mkdir(parents=True, exist_ok=True)
    try:
        if not (root / MANIFEST).is_file():
            write_manifest(root, "run", config=config)
        yield root
    except BaseException:
        if made is not None and not any(root.glob(f"stages/*/{STAGE_FILE}")):
            shutil.rmtree(made, ignore_errors=True)
        raise


def stage_facts(stage: Stage) -> dict:
    return json.loads((stage.path / STAGE_FILE).read_text(encoding="utf-8"))["facts"]


def run_pipeline(config: dict) -> dict:
    """Run (or reuse) every stage of ``config``; returns the measurements of the adapted model and the source."""
    from vocgraft.corpus import read_lines
    from vocgraft.models import load_tokenizer

    root = Path(config["out"])
    adapt, seed = config["adapt"], config["seed"]
    inputs = {"model": config["model"], "corpus": fingerprint(config["corpus"]), "sample": config["sample"]}
    evaluation = dict(config["eval"], heldout=fingerprint(config["heldout"]), lang=config["lang"])
    evaluation = _keyed(config, "eval", evaluation)
    stages: list[Stage] = []

    def stage(name: str, params: dict, build: Callable[[Path], dict | None]) -> Stage:
        stages.append(run_stage(root, name, params, build))
        return stages[-1]

    def lines() -> list[str]:
        return read_lines(config["corpus"], sample=config["sample"], seed=seed)

    source_eval = stage(
        "eval-source", {"model": config["model"], **evaluation}, lambda p: _evaluate(config["model"], None, config, p)
    )
    vocab = adapt["aux_vocab_size"] if adapt["mode"] == "expand" else adapt["vocab_size"]
    tokenizer = stage(
        "tokenizer",
        {**inputs, "mode": adapt["mode"], "seed": seed, "vocab_size": vocab, "keep_marks": adapt["keep_marks"]},
        lambda p: _train_tokenizer(config, lines(), p),
    )
    adapt_params = _keyed(
        config, "adapt", dict(adapt, protect=fingerprint(adapt["protect"]) if adapt["protect"] else None, seed=seed)
    )
    if adapt["mode"] != "vocadt":  # its settings do not change the other modes' stages (nor their earlier keys)
        adapt_params.pop("vocadt", None)
    final = stage(
        "adapt",
        {**inputs, **adapt_params, "tokenizer": tokenizer.key},
        lambda p: _adapt(config, lines(), tokenizer.path, p),
    )
    if config["train"] is not None:
        adapted = final
        final = stage(
            "train",
            _keyed(config, "train", dict(config["train"], corpus=inputs["corpus"], model=adapted.key, seed=seed)),
            lambda p: _train(config, adapted.path, p),
        )
    model_eval = stage(
        "eval", {"model": final.key, **evaluation}, lambda p: _evaluate(str(final.path), config["model"], config, p)
    )
    source_lapt = None
    if config["train"] is not None and config["report"]["source_lapt"]:
        # the reference a trained model is judged against: the source given the same LAPT (same lines, steps and
        # strategy), so the recommendation credits the vocabulary, not the training; one run per train setting,
        # shared by every variant of a sweep
        trained_source = stage(
            "train-source",
            _keyed(config, "train", dict(config["train"], corpus=inputs["corpus"], model=config["model"], seed=seed)),
            lambda p: _train(config, config["model"], p),
        )
        source_lapt = stage_facts(
            stage(
                "eval-source-train",
                {"model": trained_source.key, **evaluation},
                lambda p: _evaluate(str(trained_source.path), config["model"], config, p),
            )
        )

    source, result = stage_facts(source_eval), stage_facts(model_eval)
    size = len(load_tokenizer(str(final.path)))
    reference = source_lapt or source
    return {
        "mode": adapt["mode"],
        "new_tokens": adapt["new_tokens"] if adapt["mode"] == "expand" else None,
        "init": adapt["init"] if adapt["mode"] != "vocadt" else "vocadt",
        "train": config["train"],
        "vocab_size": size,
        "model_dir": str(final.path),
        "source": source,
        "source_lapt": source_lapt,
        "adapted": result,
        "speedup": result["speedup"],
        "bits_per_byte": result["bits_per_byte"],
        "measured": AFTER_LAPT if config["train"] is not None else AFTER_INIT,
        "source_bits_per_byte": source["bits_per_byte"],
        "reference": SOURCE_LAPT if source_lapt is not None else SOURCE,
        "reference_bits_per_byte": reference["bits_per_byte"],
        "stages": [asdict(s) | {"path": str(s.path)} for s in stages],
    }


# when a point's bits/byte was measured, and what it is compared with (report.json carries these words)
AFTER_INIT, AFTER_LAPT = "right after initialization", "after LAPT"
SOURCE, SOURCE_LAPT = "source", "source + LAPT"


def _keyed(config: dict, section: str, params: dict) -> dict:
    """A stage's key parameters: the section's settings with its device and dtype as resolved (dtype only when not
    auto, device only for evaluation, where it changes the speeds measured) and without the settings that do not
    change the result (how surgery edits the files, gradient checkpointing), so keys of earlier runs still hold."""
    from vocgraft.pipeline.config import placement

    ignored = {"device", "dtype", "surgery", "gradient_checkpointing"}
    keyed = {k: v for k, v in params.items() if k not in ignored and not (k == "mixed_precision" and v == "auto")}
    device, dtype = placement(config, section)
    if dtype != "auto":
        keyed["dtype"] = dtype
    if section == "eval" and device != "auto":
        keyed["device"] = device
    return keyed


def _step(config: dict, tokenizer_dir: Path | None = None):
    """The recipe's vocabulary step for the ``adapt`` section; ``tokenizer_dir``: the tokenizer stage's output
    (expand's aux tokenizer, replace's target tokenizer), None for the tokenizer stage itself."""
    from vocgraft.corpus import read_lines
    from vocgraft.recipes.expand import ExpandStep
    from vocgraft.recipes.replace import ReplaceStep
    from vocgraft.tokenization.scripts import parse_scripts

    adapt = config["adapt"]
    given = str(tokenizer_dir) if tokenizer_dir is not None else None
    if adapt["mode"] == "replace":
        return ReplaceStep(tokenizer_spec=given, target_vocab_size=adapt["vocab_size"], keep_marks=adapt["keep_marks"])
    protect, aux_size = None, adapt["aux_vocab_size"]
    if tokenizer_dir is not None:
        if adapt["protect"]:  # read for the expansion only
            protect = read_lines(adapt["protect"], limit=adapt["protect_lines"])
        # the adapt stage has always recorded the recipe's default size for its given aux tokenizer
        aux_size = ExpandStep.aux_vocab_size
    return ExpandStep(
        adapt["new_tokens"],
        aux_tokenizer_spec=given,
        aux_vocab_size=aux_size,
        protect=protect,
        scripts=parse_scripts(adapt["scripts"]),
        keep_marks=adapt["keep_marks"],
    )


def _train_tokenizer(config: dict, lines: list[str], path: Path) -> dict:
    """The tokenizer stage: the tokenizer the recipe's vocabulary step would train (expand: the auxiliary
    tokenizer; replace: the target tokenizer), saved so the adapt stage (and a rerun) uses it as given."""
    from vocgraft.models import load_tokenizer
    from vocgraft.tokenization.portable import save_portable

    source = load_tokenizer(config["model"])
    tokenizer, marks = _step(config).train_tokenizer(source, lines, config["seed"])
    print(f"tokenizer stage: {marks.describe()}", file=sys.stderr)
    save_portable(tokenizer, path)
    return {"size": len(tokenizer), "lines": len(lines), "keep_marks": marks.to_dict()}


def _adapt(config: dict, lines: list[str], tokenizer_dir: Path, path: Path) -> dict:
    from vocgraft.pipeline.config import placement
    from vocgraft.recipes.adapt import adapt_model
    from vocgraft.recipes.common import method_args

    adapt = config["adapt"]
    if adapt["mode"] == "vocadt":
        return _vocadt(config, tokenizer_dir, path)
    device, dtype = placement(config, "adapt")
    step = _step(config, tokenizer_dir)
    _, result = adapt_model(
        config["model"],
        lines,
        step,
        adapt["init"],
        path,
        seed=config["seed"],
        device=device,
        dtype=dtype,
        surgery=adapt["surgery"],
        **method_args(adapt, adapt["init"]),
    )
    return {"plan": result.plan.summary(), "timings": result.timings}


def _vocadt(config: dict, tokenizer_dir: Path, path: Path) -> dict:
    """``adapt.mode: vocadt``: VocADT's adapters trained over the source with the tokenizer stage's target tokenizer
    (:func:`vocgraft.recipes.vocadt.vocadt_model`, as `vocgraft vocadt --tokenizer` runs it)."""
    from vocgraft.pipeline.config import placement
    from vocgraft.recipes.vocadt import VocadtSettings, vocadt_model
    from vocgraft.settings.vocadt import training_settings
    from vocgraft.train.lapt import TrainConfig

    section = config["adapt"]["vocadt"]
    device, dtype = placement(config, "adapt")
    settings = VocadtSettings.from_flags(
        section | {"tokenizer": str(tokenizer_dir), "vocab_size": config["adapt"]["vocab_size"]}
    )
    training = TrainConfig(
        model=config["model"],
        corpus=config["corpus"],
        out=str(path),
        seed=config["seed"],
        show_progress=False,
        resume=True,  # a run killed mid-training continues from its last checkpoint
        device=device,
        dtype=dtype,
        **training_settings(section),
    )
    summary = vocadt_model(settings, training)
    facts = {k: summary[k] for k in ("steps", "tokens_per_second", "val_loss_start", "val_loss_end")}
    return facts | {"vocadt": summary["vocadt"]}


def _train(config: dict, model_dir: str | Path, path: Path) -> dict:
    from vocgraft.pipeline.config import placement
    from vocgraft.train.lapt import TrainConfig, train

    device, dtype = placement(config, "train")
    settings = dict(config["train"], seed=config["seed"], show_progress=False, device=device, dtype=dtype)
    # resume: a run killed mid-training continues from its last checkpoint (<stage>.checkpoints)
    summary = train(TrainConfig(model=str(model_dir), corpus=config["corpus"], out=str(path), resume=True, **settings))
    return {k: summary[k] for k in ("steps", "tokens_per_second", "val_loss_start", "val_loss_end", "train_seconds")}


def _evaluate(model_spec: str, baseline: str | None, config: dict, path: Path) -> dict:
    """The eval stage (:func:`vocgraft.eval.stage.evaluate_model`) on ``config``'s held-out text and eval section."""
    from vocgraft.eval.stage import evaluate_model
    from vocgraft.pipeline.config import placement

    device, dtype = placement(config, "eval")
    return evaluate_model(
        model_spec,
        baseline=baseline,
        heldout=config["heldout"],
        settings=config["eval"],
        lang=config["lang"],
        device=device,
        dtype=dtype,
        out=path,
    )
