"""The `vocgraft` command: one subcommand per stage."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path

from vocgraft.corpus import SHARED_CORPORA, CorpusError
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
        needs = ", ".join(USER_INPUTS.get(need, need) for need in sorted(method.needs)) or "nothing"
        print(f"{method.name}: {method.summary}\n  defined in: {method.reference}\n  needs: {needs}")
        for option in method.options:
            print(f"  {option.flag} (default {option.default}): {option.help}")
    print(f"{VOCADT.name} (trains; not an --init method): {VOCADT.summary}\n  defined in: {VOCADT.reference}")
    print(f"  runs as: {VOCADT.runs_as}")
    for setting in VOCADT.settings:
        where = f"{setting.cli_flag} / adapt.vocadt.{setting.yaml_key}"
        print(f"  {where} (default {setting.default}): {setting.help_text()}")


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
    from vocgraft.devices import dtype_name, resolve_device
    from vocgraft.eval import lm_eval_task as lmt
    from vocgraft.eval.bpb import default_prefix_id
    from vocgraft.models import dtype_choice, load_tokenizer, resolve

    pretrained = resolve(args.model)
    tokenizer = load_tokenizer(args.model)
    choice = dtype_choice(args.model, args.dtype, args.device)
    local = Path(pretrained).is_dir()
    # a hub id's stored dtype is unknown until it is loaded: lm-eval then reads it from the checkpoint, as vocgraft
    dtype = dtype_name(choice.compute) if local or args.dtype != "auto" else "auto"
    model_args = lmt.model_args(
        Path(pretrained).absolute() if local else pretrained,
        default_prefix_id(tokenizer),
        max_length=args.max_length,
        dtype=dtype,
    )
    device = str(resolve_device(args.device))
    task = lmt.write_task(
        args.text,
        args.out,
        name=args.name,
        limit=args.limit,
        field=args.field,
        overwrite=args.overwrite,
        manifest={"model": args.model, "model_args": model_args, "device": device, "batch_size": args.batch_size},
    )
    lines = task.data_path.read_text(encoding="utf-8").splitlines()
    long = lmt.lines_longer_than(tokenizer, lines, args.max_length)
    if long:
        warn(
            "lm-eval-task",
            f"{long} of {task.lines} lines {'has' if long == 1 else 'have'} more than --max-length {args.max_length} "
            "tokens; lm_eval scores them "
            "in disjoint windows, vocgraft eval in windows overlapping by half, so bits/byte differs a little on "
            "them; a larger --max-length (here and in vocgraft eval) removes the difference.",
        )
    limit = f" --limit {args.limit}" if args.limit else ""
    print(
        f"lm-eval task {task.name}: {task.lines} lines, {task.bytes:,} bytes -> {task.folder}\n"
        f"scores like `vocgraft eval --model {args.model} --text {args.text}{limit} --max-length {args.max_length}`:"
    )
    print(lmt.shell_line(lmt.lm_eval_argv(task, model_args, device=device, batch_size=args.batch_size)))


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


def report_stream(args):
    """Where a command's Markdown report goes: stdout, unless ``--json`` sends the JSON there."""
    from vocgraft.outdir import is_stdout

    return sys.stderr if getattr(args, "json", None) and is_stdout(args.json) else sys.stdout


def cmd_expand(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.recipes.expand import expand_model
    from vocgraft.recipes.expansion_checks import check_corpus_scripts, check_heldout_scripts, explain_zero_tokens
    from vocgraft.tokenization.scripts import parse_scripts

    lines = read_lines(args.corpus, sample=args.sample, seed=args.seed, field=args.field)
    scripts = parse_scripts(args.scripts)
    check_corpus_scripts(scripts, lines, args.corpus)
    protect = read_lines(args.protect) if args.protect else None
    heldout = read_lines(args.heldout, limit=args.eval_limit) if args.heldout else None  # read before the work
    if heldout is not None:
        with warnings.catch_warnings(record=True) as caught:  # said now, before the work
            warnings.simplefilter("always", UserWarning)
            check_heldout_scripts(lines, heldout, args.corpus, args.heldout)
        for item in caught:
            warn("expand", str(item.message))
    with warnings.catch_warnings(record=True) as caught:  # shown below as our own one-line warnings
        warnings.simplefilter("always", UserWarning)
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
    added = result.expansion.to_dict()
    for item in caught:
        if not (added["added"] == 0 and str(item.message).startswith("only 0 of")):  # explained better below
            warn("expand", " ".join(str(item.message).split()))
    scripts = ", ".join(result.scripts) if result.scripts else "any script"
    print(
        f"added {added['added']} tokens ({added['intermediate_count']} intermediates; wanted tokens in {scripts}) "
        f"with init={args.init} -> {out}"
    )
    if added["skipped_reasons"]:
        print("candidates skipped: " + ", ".join(f"{n} {key}" for key, n in added["skipped_reasons"].items()))
    if added["added"] == 0:
        warn("expand", f"0 new tokens were added, so {out} tokenizes as the source does: {explain_zero_tokens(added)}.")
    if heldout is not None:
        from vocgraft.models import load_tokenizer
        from vocgraft.recipes.expansion_checks import expansion_summary

        summary = expansion_summary(
            load_tokenizer(args.model),
            result.tokenizer,
            result.plan.new_ids,
            heldout,
            rows=result.model.get_input_embeddings().weight.shape[0],
        )
        print(json.dumps(summary, indent=2))
        if added["added"] and summary["new_tokens_used_share"] == 0:
            warn(
                "expand",
                f"none of the {added['added']} new tokens occurs in --heldout {args.heldout}: it is not text of the "
                "corpus's language, or the corpus is too small to have found its frequent words.",
            )


def cmd_replace(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.recipes.replace import replace_model

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
    summary = result.plan.summary()
    print(
        f"replaced the tokenizer: {summary['target_size']} tokens, {summary['copied']} copied from the source, "
        f"{summary['new']} initialized with {args.init} -> {out}"
    )
    if result.stats:
        print(json.dumps(result.stats, indent=2, default=str))
    if text is not None:
        from vocgraft.eval import encode_lines, fertility, speedup
        from vocgraft.models import load_tokenizer

        before = fertility(encode_lines(load_tokenizer(args.model), text), text)
        after = fertility(encode_lines(result.tokenizer, text), text)
        print(
            f"tokens/line on {len(text)} held-out lines: {before['tokens_per_line_mean']:.2f} -> "
            f"{after['tokens_per_line_mean']:.2f} (speedup proxy "
            f"{speedup(before['tokens_per_line_mean'], after['tokens_per_line_mean']):.3f})"
        )


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


def corpus_spec(args) -> str | list:
    """``--corpus`` (one or more) and ``--corpus-weights`` as a TrainConfig corpus: a path, or a weighted mix."""
    if args.corpus_weights is None:
        if len(args.corpus) == 1:
            return args.corpus[0]
        return [[path, 1.0] for path in args.corpus]  # several corpora, equal shares
    if len(args.corpus_weights) != len(args.corpus):
        raise CorpusError(
            f"{len(args.corpus)} corpora but {len(args.corpus_weights)} --corpus-weights; give one weight per corpus."
        )
    return [[path, weight] for path, weight in zip(args.corpus, args.corpus_weights)]


def train_config(args):
    from vocgraft.train.lapt import TrainConfig
    from vocgraft.train.recipe import with_recipe

    names = TrainConfig.__dataclass_fields__.keys() - {"show_progress", "inputs", "corpus", "adapter"}
    names &= set(vars(args))  # vocadt has no --strategy / --objective / --recipe
    settings = {name: getattr(args, name) for name in names}
    if getattr(args, "recipe", None):
        settings = with_recipe(args.recipe, settings)
    return TrainConfig(corpus=corpus_spec(args), **settings)


def print_training(summary: dict, out: str) -> None:
    if summary.get("finished_before"):  # --resume on a run whose model was already saved: nothing trained
        removed = summary.get("removed_checkpoints")
        cleaned = f"; removed its leftover checkpoints {removed}" if removed else ""
        print(f"this run is finished (model at {out}){cleaned}")
        return
    if summary["resumed_from_step"] is not None:
        print(f"resumed from step {summary['resumed_from_step']}")
    recipe = f"recipe {summary['recipe']}, " if summary.get("recipe") else ""
    group = summary.get("new_rows")
    rows = f", {group['rows']} new rows at {group['lr_scale']:g} x lr" if group else ""
    print(
        f"{summary['strategy']}/{summary['objective']}: {summary['steps']} steps "
        f"({summary['epochs']} epochs of {summary['train_sequences']} sequences of {summary['seq_len']} tokens, "
        f"{recipe}{summary['warmup_steps']} warmup, lines joined by {summary['join']}{rows}), "
        f"{summary['tokens_per_second']:.0f} tokens/s, validation loss {summary['val_loss_start']:.3f} -> "
        f"{summary['val_loss_end']:.3f}, peak RSS {summary['peak_rss_mib']:.0f} MiB -> {out}"
    )


def cmd_train(args) -> None:
    from vocgraft.train.lapt import train

    summary = train(train_config(args))
    if summary["main_process"]:  # under accelerate launch: one report, from the main process
        print_training(summary, args.out)


def cmd_vocadt(args) -> None:
    from vocgraft.recipes.vocadt import VocadtSettings, vocadt_model

    settings = VocadtSettings(
        tokenizer=args.tokenizer,
        kind=args.kind,
        vocab_size=args.vocab_size,
        alpha=args.alpha,
        candidates=None if args.dense else args.max_candidates,
        adapters=args.adapters,
    )
    summary = vocadt_model(settings, train_config(args))
    if not summary["main_process"]:
        return
    if summary.get("finished_before"):
        print_training(summary, args.out)
        return
    facts = summary["vocadt"]
    memory = {k: f"{v / 2**20:,.0f} MiB" for k, v in facts["memory"].items()}
    print(
        f"{facts['adapters']} {facts['form']} adapters (x{facts['adapter_modules']}): rows started as "
        f"{facts['rows_started_as']}, aux loss over {facts['aux_loss_rows']} shared-vocabulary rows; "
        f"adapter training state {memory}"
    )
    print_training(summary, args.out)


def cmd_downstream(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.eval.downstream import DownstreamSpec, evaluate_downstream, markdown_summary
    from vocgraft.eval.generation import prompts_from_lines
    from vocgraft.eval.mt import LANGUAGE_NAMES, read_pairs
    from vocgraft.eval.tasks import read_records
    from vocgraft.preflight import read_templates

    tasks = {}
    for item in args.task or []:
        task, _, path = item.partition("=")
        if not path:
            raise CorpusError(f"--task {item!r}: expected TASK=FILE, e.g. nli=xnli-el.jsonl.")
        tasks[task] = read_records(path, task)
    spec = DownstreamSpec(
        lang=args.lang,
        prompts=prompts_from_lines(read_lines(args.prompts, limit=args.num_prompts)) if args.prompts else [],
        max_new_tokens=args.max_new_tokens,
        mt_pairs=read_pairs(args.mt) if args.mt else [],
        mt_directions=tuple(args.mt_directions),
        mt_shots=args.shots,
        mt_limit=args.mt_limit,
        mt_template=args.mt_template,
        mt_max_new_tokens=args.mt_max_new_tokens,
        tasks=tasks,
        templates=read_templates(args.templates) if args.templates else None,
    )
    if spec.mt_pairs and args.lang not in LANGUAGE_NAMES:
        warn(
            "downstream",
            f"--lang {args.lang}: no name known for this language code, so the MT prompts ask to translate to "
            f"'{args.lang}', which a model may not understand; the known codes are {', '.join(LANGUAGE_NAMES)}.",
        )
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
    if result.forced and result.choice.reason is not None:
        warn(
            "export gguf",
            f"--force-pre {result.choice.pre}: llama.cpp will not tokenize as the model's tokenizer does "
            f"({result.choice.reason}); "
            + (f"{result.mismatch.describe()} tokenize differently." if result.mismatch else ""),
        )
    elif result.warning:
        warn("export gguf", result.warning)
    print(result.describe())


def print_sweep(sweep: dict, report: Path) -> None:
    reused = sum(s["reused"] for p in sweep["points"] for s in p["stages"])
    built = sum(not s["reused"] for p in sweep["points"] for s in p["stages"])
    text = report.read_text(encoding="utf-8")
    print(text[: text.index("\n![")])  # the report without its image links
    print(f"{built} stages built, {reused} reused; report.md, report.html, plot and JSON in {report.parent}")


def cmd_run(args) -> None:
    from vocgraft.pipeline.config import load_config
    from vocgraft.pipeline.sweep import run_sweep, write_report

    config = load_config(args.config, args.overrides)
    sweep = run_sweep(config, [config["adapt"]["new_tokens"]], [config["adapt"]["init"]])
    print_sweep(sweep, write_report(sweep, config["out"]))


def cmd_sweep(args) -> None:
    from vocgraft.parsing import parse_ints
    from vocgraft.pipeline.config import load_config
    from vocgraft.pipeline.sweep import run_sweep, write_report

    config = load_config(args.config, args.overrides)
    if args.tolerance is not None:
        config["report"]["tolerance"] = args.tolerance
    ks = parse_ints(args.k, "k") if args.k else [config["adapt"]["new_tokens"]]
    inits = [i for i in args.init.split(",") if i] if args.init else [config["adapt"]["init"]]
    sizes = parse_ints(args.sizes, "sizes") if args.sizes else None
    sweep = run_sweep(config, ks, inits, sizes, jobs=args.jobs)
    print_sweep(sweep, write_report(sweep, config["out"]))


def cmd_demo(args) -> None:
    """A small sweep on the embedded defaults: SmolLM2 + k Greek tokens x init methods, report + recommendation."""
    from vocgraft.parsing import parse_ints
    from vocgraft.pipeline.config import validate
    from vocgraft.pipeline.sweep import run_sweep, write_report

    corpora = SHARED_CORPORA / args.lang
    raw = {
        "model": args.model,
        "corpus": str(corpora / "train.txt"),
        "heldout": str(corpora / "heldout.txt"),
        "lang": args.lang,
        "out": args.out,
        "sample": args.sample,
        # English training text: the new merges must not change how the source language tokenizes
        "adapt": {"mode": "expand", "aux_vocab_size": args.aux_vocab_size}
        # distill as the end-to-end grid ran it (every pair merged): the only init whose new tokens are generated
        | ({"distill_merge": "all"} if "distill" in args.init.split(",") else {})
        | ({"protect": str(SHARED_CORPORA / "en" / "train.txt")} if args.lang != "en" else {}),
        "eval": {"limit": args.limit},
        "device": args.device,
        "dtype": args.dtype,
    }
    print(
        f"vocgraft demo: {args.model} + k in {args.k} {args.lang} tokens x init in {args.init}, trained on "
        f"{args.sample} lines of {raw['corpus']}, measured on the first {args.limit} lines of {raw['heldout']}",
        file=sys.stderr,
    )
    config = validate(raw, "the demo's settings")
    sweep = run_sweep(config, parse_ints(args.k, "k"), args.init.split(","))
    print_sweep(sweep, write_report(sweep, args.out))


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
