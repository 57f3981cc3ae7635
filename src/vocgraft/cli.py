"""The `vocgraft` command: one subcommand per stage."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from vocgraft.outdir import write_json


def cmd_info(args) -> None:
    from vocgraft.models import describe, timed_load

    model, tokenizer, seconds = timed_load(args.model, args.dtype, args.device)
    info = describe(model, tokenizer).to_dict() | {"load_seconds": round(seconds, 2)}
    print(json.dumps(info, indent=2))


def cmd_methods(args) -> None:
    """The init method registry (what each method needs, its settings, where it is defined), then VocADT, the
    method that trains (vocgraft.settings.vocadt)."""
    from vocgraft.init import METHODS
    from vocgraft.recipes.common import USER_INPUTS
    from vocgraft.settings.vocadt import METHOD as VOCADT

    for method in sorted(METHODS.values(), key=lambda m: m.name):
        print(method.describe(USER_INPUTS))
    print(VOCADT.describe())


def cmd_eval(args) -> None:
    from vocgraft.eval.files import eval_markdown, result_warnings, run_eval
    from vocgraft.outdir import finite_json

    result = run_eval(
        args.model,
        args.text,
        baseline=args.baseline_tokenizer,
        limit=args.limit,
        with_bpb=not args.no_bpb,
        max_length=args.max_length,
        batch_size=args.batch_size,
        field=args.field,
        dtype=args.dtype,
        device=args.device,
    )
    # first: a failed write loses nothing; on stderr when the JSON goes to stdout (`--json - | jq`)
    print(eval_markdown(result, name=Path(args.model).name or args.model), file=report_stream(args))
    for message in result_warnings(result, args.text):
        warn("eval", message)
    if args.json:
        write_json(args.json, finite_json(result), flag="--json")  # warned about above


def cmd_lm_eval_task(args) -> None:
    """Write a local lm-evaluation-harness task over ``--text`` and print the ``lm_eval`` command that scores
    ``--model`` on it as `vocgraft eval` does."""
    from vocgraft.eval.lm_eval_task import write_model_task

    made = write_model_task(
        args.model,
        args.text,
        args.out,
        name=args.name,
        limit=args.limit,
        field=args.field,
        max_length=args.max_length,
        batch_size=args.batch_size,
        dtype=args.dtype,
        device=args.device,
        overwrite=args.overwrite,
    )
    if message := made.warning():
        warn("lm-eval-task", message)
    print(made.describe())


def cmd_tokenizer_train(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.models import load_tokenizer
    from vocgraft.outdir import check_writable
    from vocgraft.tokenization import save_tokenizer, train_tokenizer
    from vocgraft.tokenization.family_rules import like_marks
    from vocgraft.tokenization.train import TokenizerError

    check_writable(args.out, args.overwrite)
    lines = read_lines(args.corpus, sample=args.sample, seed=args.seed, field=args.field)
    like = load_tokenizer(args.like) if args.like else None
    marks = like_marks(args.keep_marks, args.kind, like, lines)
    if marks is not None:
        print(marks.describe())
        like = marks.apply(like)
    try:
        tokenizer = train_tokenizer(lines, args.kind, args.vocab_size, like=like, seed=args.seed, show_progress=True)
    except TokenizerError as exc:  # a --like of the wrong family: name the flag and the path
        if like is None or "like=" not in str(exc):
            raise
        raise TokenizerError(f"--like {args.like}: {exc}") from None
    save_tokenizer(
        tokenizer,
        args.out,
        overwrite=args.overwrite,
        manifest={
            "inputs": {"corpus": args.corpus, "lines": len(lines), "like": args.like},
            "keep_marks": marks.to_dict() if marks else None,
        },
    )
    print(f"{args.kind} tokenizer with {len(tokenizer)} tokens trained on {len(lines)} lines -> {args.out}")


def warn(command: str, message: str) -> None:
    print(f"vocgraft {command}: warning: {message}", file=sys.stderr)


@contextlib.contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    """The messages of the warnings raised inside (every UserWarning, even a repeated one), for the command to print
    as its own one-line warnings: the library rooms warn, they do not print."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        yield messages
    messages.extend(str(item.message) for item in caught)


def report_stream(args):
    """Where a command's Markdown report goes: stdout, unless ``--json`` sends the JSON there."""
    from vocgraft.outdir import is_stdout

    return sys.stderr if getattr(args, "json", None) and is_stdout(args.json) else sys.stdout


def cmd_expand(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.recipes import expansion_checks as checks
    from vocgraft.recipes.expand import expand_model
    from vocgraft.tokenization.scripts import parse_scripts

    lines = read_lines(args.corpus, sample=args.sample, seed=args.seed, field=args.field)
    scripts = parse_scripts(args.scripts)
    checks.check_corpus_scripts(scripts, lines, args.corpus)
    protect = read_lines(args.protect) if args.protect else None
    heldout = read_lines(args.heldout, limit=args.eval_limit) if args.heldout else None  # read before the work
    if heldout is not None:
        with recorded_warnings() as said:  # said now, before the work
            checks.check_heldout_scripts(lines, heldout, args.corpus, args.heldout)
        for message in said:
            warn("expand", message)
    with recorded_warnings() as said:  # shown below, after what the expansion did
        out, result = expand_model(
            args.model,
            lines,
            args.new_tokens,
            args.chosen_method,  # --init with its settings and inputs, chosen by preflight
            args.out,
            aux_tokenizer_spec=args.aux_tokenizer,
            aux_vocab_size=args.aux_vocab_size,
            protect=protect,
            scripts=scripts,
            seed=args.seed,
            overwrite=args.overwrite,
            inputs={"corpus": args.corpus, "corpus_lines": len(lines), "protect": args.protect},
            dtype=args.dtype,
            device=args.device,
            surgery=args.surgery,
            keep_marks=args.keep_marks,
        )
    print(result.marks.describe())
    for message in checks.recipe_warnings(said, result):
        warn("expand", message)
    print(checks.describe_expansion(result, args.init, out))
    if message := checks.zero_tokens_warning(result, out):
        warn("expand", message)
    if heldout is not None:
        summary, unused = checks.heldout_report(args.model, result, heldout, args.heldout)
        print(json.dumps(summary, indent=2))
        if unused:
            warn("expand", unused)


def cmd_replace(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.recipes.replace import describe_replacement, heldout_tokens, replace_model

    lines = read_lines(args.corpus, sample=args.sample, seed=args.seed, field=args.field)
    text = read_lines(args.heldout, limit=args.eval_limit) if args.heldout else None  # read before the work
    out, result = replace_model(
        args.model,
        lines,
        args.chosen_method,  # --init with its settings and inputs, chosen by preflight
        args.out,
        tokenizer_spec=args.tokenizer,
        target_kind=args.kind,
        target_vocab_size=args.vocab_size,
        seed=args.seed,
        overwrite=args.overwrite,
        inputs={"corpus": args.corpus, "corpus_lines": len(lines)},
        dtype=args.dtype,
        device=args.device,
        surgery=args.surgery,
        keep_marks=args.keep_marks,
    )
    print(result.marks.describe())
    print(describe_replacement(result, args.init, out))
    if text is not None:
        print(heldout_tokens(args.model, result, text))


def cmd_plm_train(args) -> None:
    from vocgraft.train.plm import plm_train_main

    out = plm_train_main(
        args.corpus,
        args.tokenizer,
        args.out,
        args.minutes,
        steps=args.steps,
        max_lines=args.max_lines,
        seed=args.seed,
        overwrite=args.overwrite,
        device=args.device,
    )
    print(f"small target-language PLM -> {out}")


def cmd_train(args) -> None:
    from vocgraft.train.lapt import train, train_config
    from vocgraft.train.summary import describe_run

    summary = train(train_config(vars(args)))
    if summary["main_process"]:  # under accelerate launch: one report, from the main process
        print(describe_run(summary, args.out))


def cmd_vocadt(args) -> None:
    from vocgraft.recipes.vocadt import VocadtSettings, describe_adapters, vocadt_model
    from vocgraft.train.lapt import train_config
    from vocgraft.train.summary import describe_run

    summary = vocadt_model(VocadtSettings.from_flags(vars(args)), train_config(vars(args)))
    if not summary["main_process"]:
        return
    if not summary.get("finished_before"):
        print(describe_adapters(summary["vocadt"]))
    print(describe_run(summary, args.out))


def cmd_downstream(args) -> None:
    from vocgraft.eval.downstream import evaluate_downstream, markdown_summary, read_spec
    from vocgraft.preflight import read_templates

    spec = read_spec(
        args.lang,
        prompts=args.prompts,
        num_prompts=args.num_prompts,
        mt=args.mt,
        tasks=args.task or [],
        templates=read_templates(args.templates) if args.templates else None,
        max_new_tokens=args.max_new_tokens,
        mt_directions=tuple(args.mt_directions),
        mt_shots=args.shots,
        mt_limit=args.mt_limit,
        mt_template=args.mt_template,
        mt_max_new_tokens=args.mt_max_new_tokens,
    )
    if message := spec.warning():
        warn("downstream", message)
    models = [args.model, *([args.baseline] if args.baseline else [])]
    results = [evaluate_downstream(m, spec, dtype=args.dtype, device=args.device) for m in models]
    print(markdown_summary(results), file=report_stream(args))
    if args.json:
        write_json(args.json, {"lang": args.lang, "results": results}, flag="--json")


def cmd_export_gguf(args) -> None:
    from vocgraft.export.to_gguf import export_gguf

    result = export_gguf(
        args.model,
        args.out,
        outtype=args.outtype,
        text=args.text,
        force_pre=args.force_pre,
        overwrite=args.overwrite,
    )
    if message := result.caution():
        warn("export gguf", message)
    print(result.describe())


def cmd_run(args) -> None:
    from vocgraft.pipeline.config import load_config
    from vocgraft.pipeline.sweep import report_summary, run_sweep, write_report

    config = load_config(args.config, args.overrides)
    sweep = run_sweep(config, [config["adapt"]["new_tokens"]], [config["adapt"]["init"]])
    print(report_summary(sweep, write_report(sweep, config["out"])))


def cmd_sweep(args) -> None:
    from vocgraft.pipeline.config import load_config
    from vocgraft.pipeline.sweep import grid_axes, report_summary, run_sweep, write_report

    config = load_config(args.config, args.overrides)
    if args.tolerance is not None:
        config["report"]["tolerance"] = args.tolerance
    ks, inits, sizes = grid_axes(config, args.k, args.init, args.sizes)
    sweep = run_sweep(config, ks, inits, sizes, jobs=args.jobs)
    print(report_summary(sweep, write_report(sweep, config["out"])))


def cmd_demo(args) -> None:
    """A small sweep on the embedded defaults: SmolLM2 + k Greek tokens x init methods, report + recommendation."""
    from vocgraft.pipeline.demo import run_demo
    from vocgraft.pipeline.sweep import report_summary

    settings = {name: getattr(args, name) for name in ("sample", "aux_vocab_size", "limit", "out", "device", "dtype")}
    print(report_summary(*run_demo(args.model, args.lang, args.k, args.init, **settings)))


def add_method_args(p: argparse.ArgumentParser) -> None:
    """From the method registry: every init method input (``--target-plm``) and setting (``--init`` is the stage's)."""
    from vocgraft.init import INPUTS, METHODS, all_options
    from vocgraft.recipes.common import USER_INPUTS

    def users(test) -> str:
        return ", ".join(sorted(m.name for m in METHODS.values() if test(m)))

    for name, flag in USER_INPUTS.items():
        p.add_argument(flag, dest=name, help=f"{INPUTS[name]}; read by {users(lambda m: name in m.needs)}")
    for option in all_options().values():
        kind = argparse.BooleanOptionalAction if option.type is bool else None
        p.add_argument(
            option.flag,
            dest=option.name,
            **({"action": kind} if kind else {"type": option.type}),
            default=None,
            help=f"{option.help} (default {option.default}; {users(lambda m: option in m.options)})",
        )


def stage_parser(sub, name: str, stage, func, **options) -> argparse.ArgumentParser:
    """A subcommand whose flags are ``stage``'s declared settings (:mod:`vocgraft.settings`)."""
    from vocgraft.settings.flags import add_settings

    p = sub.add_parser(name, help=stage.summary)
    add_settings(p, stage.settings, **options)
    if "init" in stage.by_name:
        add_method_args(p)
    p.set_defaults(func=func)
    return p


def add_model_arg(p: argparse.ArgumentParser) -> None:
    from vocgraft.settings import common
    from vocgraft.settings.flags import add_settings

    add_settings(p, (common.MODEL, common.DEVICE, common.DTYPE))


def build_parser() -> argparse.ArgumentParser:
    from vocgraft import settings

    parser = argparse.ArgumentParser(prog="vocgraft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="load a source model and describe it")
    add_model_arg(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("methods", help="list the init methods: what each needs, its settings, its paper")
    p.set_defaults(func=cmd_methods)

    p = stage_parser(sub, "eval", settings.stage("eval"), cmd_eval)

    stage_parser(sub, "lm-eval-task", settings.stage("lm-eval-task"), cmd_lm_eval_task)

    p = sub.add_parser("tokenizer", help="tokenizer stage")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    stage_parser(tsub, "train", settings.stage("tokenizer train"), cmd_tokenizer_train)
    stage_parser(sub, "expand", settings.stage("expand"), cmd_expand)
    stage_parser(sub, "replace", settings.stage("replace"), cmd_replace)
    p = sub.add_parser("plm", help="a small target-language LM (SALT's target PLM when none can be downloaded)")
    psub = p.add_subparsers(dest="plm_command", required=True)
    stage_parser(psub, "train", settings.stage("plm train"), cmd_plm_train)

    from vocgraft.settings.train import recipe_help
    from vocgraft.settings.vocadt import training_defaults

    stage_parser(sub, "train", settings.stage("train"), cmd_train, suffix=recipe_help)
    # no recipe: the papers' values, VocADT's own learning rate
    stage_parser(sub, "vocadt", settings.stage("vocadt"), cmd_vocadt, defaults=training_defaults())
    stage_parser(sub, "downstream", settings.stage("downstream"), cmd_downstream)

    p = sub.add_parser("export", help="write a model for another engine")
    esub = p.add_subparsers(dest="export_command", required=True)
    stage_parser(esub, "gguf", settings.stage("export gguf"), cmd_export_gguf)

    overrides = "KEY=VALUE settings overriding the config's, e.g. train.lr=3e-4 eval.limit=50 (see vocgraft.settings)"
    p = sub.add_parser("run", help="the whole pipeline from a YAML config; finished stages are reused")
    p.add_argument("config", help="YAML config (see examples/)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=overrides)
    p.set_defaults(func=cmd_run)
    p = stage_parser(sub, "sweep", settings.stage("sweep"), cmd_sweep)
    p.add_argument("config", help="YAML config (see examples/); the grid overrides adapt.new_tokens / adapt.init")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=overrides)
    p = sub.add_parser("demo", help="the main job on the embedded defaults: a small Greek sweep with a recommendation")
    add_model_arg(p)
    p.add_argument("--lang", default="el", help="a language folder of the shared corpora")
    p.add_argument("--k", default="1000", help="new-token counts to try (the grid's best: 1000)")
    p.add_argument(
        "--init",
        default="mean,align,distill",
        help="init methods to compare (the default: the papers' two best and distill, the one whose new tokens "
        "are generated; each gives different rows, a test checks it)",
    )
    p.add_argument("--sample", type=int, default=8192, help="training lines for the aux tokenizer and Align")
    p.add_argument("--aux-vocab-size", type=int, default=8000)
    p.add_argument("--limit", type=int, default=200, help="held-out lines to measure on")
    p.add_argument("--out", default="vocgraft-demo", help="where stages, report.md and the plot go")
    p.set_defaults(func=cmd_demo)
    return parser


# their --out is a run folder that parallel runs share: each stage is locked instead, and a run waits for a stage
# another one is building (vocgraft.pipeline.run)
SHARED_RUN_FOLDERS = ("run", "sweep", "demo")


def output_lock(args) -> contextlib.AbstractContextManager:
    """The lock on the command's ``--out`` (:mod:`vocgraft.locks`), taken before any work."""
    from vocgraft.locks import hold

    if not getattr(args, "out", None) or args.command in SHARED_RUN_FOLDERS:
        return contextlib.nullcontext()
    return hold(args.out)


def quiet_libraries() -> None:
    """Progress bars and INFO logs of the libraries drown our own output (and an error line among them)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars


def main(argv: list[str] | None = None) -> int:
    """The error boundary: an expected failure (bad input, a missing or corrupt file, too little memory) is one line
    ``vocgraft CMD: error: ...`` and exit 2; Ctrl-C, SIGTERM and SIGHUP are one line and exit 128 + the signal
    (outputs are cleaned up by the ``finally`` blocks that build them); anything else is a bug: its traceback and a
    request to report it, exit 1."""
    import traceback

    from vocgraft.failures import (
        EXIT_BUG,
        EXIT_USER_ERROR,
        REPORT_HINT,
        exit_code,
        expected_message,
        signal_name,
        stop_signals_interrupt,
    )
    from vocgraft.ownership import check_command_outputs
    from vocgraft.preflight import check_args, command_name

    args = build_parser().parse_args(argv)
    name = command_name(args)
    try:
        with stop_signals_interrupt():
            quiet_libraries()
            check_args(args)  # every rule that needs no model, before any work
            check_command_outputs(args)  # no output is, or holds, an input; --overwrite replaces only vocgraft's
            with output_lock(args):  # one writer per --out: a second process is refused, naming this one
                args.func(args)
    except KeyboardInterrupt as interrupt:
        what = "interrupted" if signal_name(interrupt) == "SIGINT" else f"stopped by {signal_name(interrupt)}"
        print(f"vocgraft {name}: {what}; partial outputs were removed.", file=sys.stderr)
        return exit_code(interrupt)
    except Exception as exc:  # noqa: BLE001  (the boundary: sorted into the user's errors and bugs below)
        message = expected_message(exc)
        if message is None:
            traceback.print_exc()
            print(f"vocgraft {name}: internal error: {REPORT_HINT}", file=sys.stderr)
            return EXIT_BUG
        print(f"vocgraft {name}: error: {' '.join(message.split())}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
