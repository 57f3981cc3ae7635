"""The `vocgraft` command: one subcommand per stage."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path

from vocgraft.corpus import SHARED_CORPORA, CorpusError
from vocgraft.models import DEFAULT_MODEL
from vocgraft.outdir import write_json

# adapter weights are mixing coefficients around 1/m; on SmolLM2 + Greek (10 steps of 2 x 512 tokens) validation
# loss 10.96 fell to 9.52 / 8.22 / 9.41 at lr 1e-4 / 3e-4 / 1e-3 and diverged at 1e-2
VOCADT_LR = 3e-4


def cmd_info(args) -> None:
    from vocgraft.models import describe, timed_load

    model, tokenizer, seconds = timed_load(args.model, args.dtype, args.device)
    info = describe(model, tokenizer).to_dict() | {"load_seconds": round(seconds, 2)}
    print(json.dumps(info, indent=2))


def cmd_methods(args) -> None:
    """The init method registry: what each method needs, its settings, and where it is defined."""
    from vocgraft.init import METHODS
    from vocgraft.recipes.common import USER_INPUTS

    for method in sorted(METHODS.values(), key=lambda m: m.name):
        needs = ", ".join(USER_INPUTS.get(need, need) for need in sorted(method.needs)) or "nothing"
        print(f"{method.name}: {method.summary}\n  defined in: {method.reference}\n  needs: {needs}")
        for option in method.options:
            print(f"  {option.flag} (default {option.default}): {option.help}")


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
            args.init,
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
            **init_args(args),
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
        args.init,
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
        **init_args(args),
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

    config = load_config(args.config)
    sweep = run_sweep(config, [config["adapt"]["new_tokens"]], [config["adapt"]["init"]])
    print_sweep(sweep, write_report(sweep, config["out"]))


def cmd_sweep(args) -> None:
    from vocgraft.parsing import parse_ints
    from vocgraft.pipeline.config import load_config
    from vocgraft.pipeline.sweep import run_sweep, write_report

    config = load_config(args.config)
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


def add_init_args(p: argparse.ArgumentParser) -> None:
    """``--init`` and, from the method registry, every method input (``--target-plm``) and setting."""
    from vocgraft.init import INPUTS, METHODS, all_options
    from vocgraft.recipes.common import USER_INPUTS

    def users(test) -> str:
        return ", ".join(sorted(m.name for m in METHODS.values() if test(m)))

    summaries = "; ".join(f"{m.name}: {m.summary}" for m in sorted(METHODS.values(), key=lambda m: m.name))
    p.add_argument("--init", required=True, choices=sorted(METHODS), metavar="METHOD", help=summaries)
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


def init_args(args) -> dict:
    """The init method's user inputs and settings from parsed arguments (settings left unset are None)."""
    from vocgraft.init import all_options
    from vocgraft.recipes.common import USER_INPUTS

    return {
        "method_inputs": {name: getattr(args, name) for name in USER_INPUTS},
        "options": {name: getattr(args, name) for name in all_options()},
    }


def add_keep_marks_arg(p: argparse.ArgumentParser, where: str) -> None:
    from vocgraft.tokenization.marks import KEEP_MARKS_SETTINGS, MIN_MARK_SHARE

    p.add_argument(
        "--keep-marks",
        choices=KEEP_MARKS_SETTINGS,
        default="auto",
        help=f"keep combining marks (vowel signs, viramas) with their letters in {where}; auto: on when the "
        f"source's regex cuts them off, they are at least {MIN_MARK_SHARE * 100:.0f}%% of the corpus's letters, and "
        "the source would not start producing tokens it never produced; with a given aux/target tokenizer: as that "
        "one does",
    )


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="HF directory, hub id, .gguf file, or a packaged model: 'smollm2' (default) or 'gemma3-270m'",
    )
    add_device_args(p)


def add_device_args(p: argparse.ArgumentParser, *, dtype: bool = True, dtype_help: str | None = None) -> None:
    """``--device`` and (unless ``dtype`` is False) ``--dtype``: resolved by :mod:`vocgraft.devices`."""
    from vocgraft.devices import DEVICE_HELP, DTYPE_CHOICES, DTYPE_HELP

    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    if dtype:
        p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=dtype_help or DTYPE_HELP)


def add_surgery_arg(p: argparse.ArgumentParser) -> None:
    from vocgraft.recipes.common import SURGERY_HELP, SURGERY_PATHS

    p.add_argument("--surgery", default="auto", choices=SURGERY_PATHS, help=SURGERY_HELP)


def add_train_args(p: argparse.ArgumentParser, *, strategies: bool = True, lr: float = 1e-4) -> None:
    """LAPT's flags. With ``strategies`` (`vocgraft train`) a recipe (``--recipe``) fills in every recipe setting
    not given, so those flags default to None here; without (`vocgraft vocadt`) they take the papers' values."""
    from vocgraft.train.data import DEFAULT_JOIN, JOINS
    from vocgraft.train.objectives import OBJECTIVES
    from vocgraft.train.recipe import DEFAULT_RECIPE, PAPERS, RECIPES
    from vocgraft.train.strategies import STRATEGIES

    def preset(name: str, value=None):
        """(default, help suffix) of a recipe setting"""
        value = PAPERS[name] if value is None else value
        return (None, f" (default: the recipe's; {DEFAULT_RECIPE}: {value})") if strategies else (value, "")

    p.add_argument(
        "--model", required=True, help="model directory (e.g. the output of vocgraft expand), hub id or alias"
    )
    p.add_argument(
        "--corpus", required=True, nargs="+", help="target-language text: file, folder, JSONL or hf:dataset spec; "
        "several make a mix (see --corpus-weights)"
    )  # fmt: skip
    p.add_argument(
        "--corpus-weights", type=float, nargs="+", help="sampling weight per --corpus (default: equal shares)"
    )
    p.add_argument("--out", required=True, help="where the trained model directory goes")
    if strategies:
        p.add_argument(
            "--recipe", default=DEFAULT_RECIPE, choices=list(RECIPES), help="preset of the settings below marked "
            "'the recipe's' (papers: 2x2 + MTP, 2 epochs, lr 1e-4 cosine, 100 warmup updates, weight decay 0.01, "
            "batch 8 x 512; quick: LoRA + CLM, 100 updates); a flag given wins over its recipe value"
        )  # fmt: skip
        default, more = preset("strategy")
        p.add_argument(
            "--strategy", default=default, choices=STRATEGIES, help="two-stage, two-stage-2x2: embeddings + head "
            f"first, then LoRA or 2x2{more}"
        )  # fmt: skip
        default, more = preset("objective")
        p.add_argument("--objective", default=default, choices=OBJECTIVES, help=f"mtp adds a head predicting t+2{more}")
        p.add_argument(
            "--stage1-share", type=float, default=0.5, help="two-stage strategies: share of the updates for "
            "embeddings + head only"
        )  # fmt: skip
    default, more = preset("seq_len")
    p.add_argument("--seq-len", type=int, default=default, help=f"tokens per training sequence{more}")
    default, more = preset("batch_size")
    p.add_argument("--batch-size", type=int, default=default, help=f"sequences per process and micro-batch{more}")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    budget = p.add_mutually_exclusive_group()
    default, more = preset("epochs")
    budget.add_argument("--epochs", type=float, default=default, help=f"passes over the data (fractional){more}")
    budget.add_argument(
        "--max-steps", type=int, help="optimizer updates, whatever the data's size (past one pass the data is "
        "reshuffled and goes on): equal updates for models with different tokenizers"
    )  # fmt: skip
    budget.add_argument(
        "--max-tokens", type=int, help="a budget in training tokens: this // (global batch x --seq-len) updates"
    )
    default, more = preset("lr", lr)
    p.add_argument("--lr", type=float, default=default, help=f"peak learning rate (cosine schedule){more}")
    default, more = preset("warmup_steps")
    p.add_argument(
        "--warmup-steps", type=int, default=default, help="linear warmup updates, at most 10%% of each phase's "
        f"updates and at least 1{more}"
    )  # fmt: skip
    default, more = preset("weight_decay")
    p.add_argument("--weight-decay", type=float, default=default, help=f"AdamW's decoupled weight decay{more}")
    p.add_argument(
        "--join", default=DEFAULT_JOIN, choices=JOINS, help="what joins corpus lines when they are packed into "
        "sequences: newline (a line break token, as the tokenizer encodes one after text), eos (the model learns to "
        "stop after every line) or none"
    )  # fmt: skip
    if strategies:
        p.add_argument(
            "--new-rows-lr-scale", type=float, default=1.0, help="learning rate of the new vocabulary rows (the "
            "model's vocgraft-plan.json: expanded or non-copied ids; input embedding, head and MTP head) as a "
            "multiple of --lr, schedule included; 0 freezes them"
        )  # fmt: skip
        p.add_argument(
            "--new-rows-weight-decay", type=float, help="weight decay of the new vocabulary rows (default: "
            "--weight-decay)"
        )  # fmt: skip
    p.add_argument("--sample", type=int, help="|D|: train on a seeded sample of this many lines")
    p.add_argument("--val-lines", type=int, default=256, help="lines held out for the validation loss")
    p.add_argument("--eval-every", type=int, help="steps between validation losses (default: 10 over the run)")
    p.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    p.add_argument("--save-minutes", type=float, help="also checkpoint after this many minutes of training")
    p.add_argument("--checkpoint-dir", help="default: <out>.checkpoints")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep the last checkpoint after success")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint (if any)")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--field", default="text", help="JSONL/dataset field holding the text")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    add_device_args(
        p,
        dtype_help="dtype the model is loaded and saved in: auto (as the checkpoint stores it), bfloat16, float16 or "
        "float32; trained weights are kept in float32 while training",
    )
    p.add_argument(
        "--mixed-precision", default="auto", choices=("auto", "no", "bf16", "fp16"),
        help="compute precision (accelerate autocast; master weights and optimizer state stay float32): auto = bf16 "
        "where the device computes bfloat16 natively (a GPU with bf16, a CPU with avx512_bf16/AMX) or the weights are "
        "bfloat16, fp16 for float16 weights on a GPU, else no; --resume keeps the run's",
    )  # fmt: skip
    p.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute activations in the backward pass (less memory)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vocgraft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="load a source model and describe it")
    add_model_arg(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("methods", help="list the init methods: what each needs, its settings, its paper")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("eval", help="token counts, speedup proxy, bits per byte and perplexity on a text")
    add_model_arg(p)
    p.add_argument("--text", required=True, help="text file, folder, .jsonl, or hf:NAME[:SPLIT]")
    p.add_argument("--field", default="text", help="JSONL / dataset field holding the text")
    p.add_argument("--baseline-tokenizer", help="tokenizer (or model) to compare token counts with: the speedup proxy")
    p.add_argument("--limit", type=int, help="only the first N lines")
    p.add_argument("--max-length", type=int, default=512, help="context window for bits/byte (longer lines: strided)")
    p.add_argument("--batch-size", type=int, default=8, help="batch budget = batch size x max length tokens")
    p.add_argument("--no-bpb", action="store_true", help="token counts only; skip the model forward passes")
    p.add_argument("--json", help="also write the full result as JSON to this path (- for stdout)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "lm-eval-task", help="held-out text as an lm-evaluation-harness task, and the lm_eval command that scores a "
        "model on it as `vocgraft eval` does"
    )  # fmt: skip
    add_model_arg(p)
    p.add_argument("--text", required=True, help="held-out text: file, folder, .jsonl, or hf:NAME[:SPLIT]")
    p.add_argument("--field", default="text", help="JSONL / dataset field holding the text")
    p.add_argument("--out", required=True, help="the task folder to write (the YAML and the lines it scores)")
    p.add_argument("--name", help="task name (default: vocgraft_<file name>)")
    p.add_argument("--limit", type=int, help="only the first N lines")
    p.add_argument("--max-length", type=int, default=512, help="context window, as vocgraft eval's --max-length")
    p.add_argument("--batch-size", type=int, default=8, help="lm_eval --batch_size (windows per forward pass)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_lm_eval_task)

    p = sub.add_parser("tokenizer", help="tokenizer stage")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    t = tsub.add_parser("train", help="train an auxiliary target-language tokenizer")
    t.add_argument("--corpus", required=True, help="text file, folder, .jsonl, or hf:NAME[:SPLIT]")
    t.add_argument("--field", default="text")
    t.add_argument("--kind", required=True, choices=["bytelevel-bpe", "sp-bpe", "sp-unigram"])
    t.add_argument("--vocab-size", type=int, default=50000)
    t.add_argument("--like", help="source model/tokenizer whose pre-tokenization and special tokens to copy")
    add_keep_marks_arg(t, "the split regex copied from a byte-level --like")
    t.add_argument("--sample", type=int, help="train on a seeded sample of N lines")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True)
    t.add_argument("--overwrite", action="store_true")
    t.set_defaults(func=cmd_tokenizer_train)

    p = sub.add_parser("expand", help="add the top-k target-language tokens as real merges and initialize them")
    add_model_arg(p)
    p.add_argument("--corpus", required=True, help="target-language training text")
    p.add_argument("--field", default="text")
    p.add_argument("--new-tokens", type=int, required=True, help="k: vocabulary rows to add (intermediates count)")
    add_init_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--aux-tokenizer", help="a trained auxiliary tokenizer (default: train one on --corpus)")
    p.add_argument("--aux-vocab-size", type=int, default=16000)
    p.add_argument("--sample", type=int, help="use a seeded sample of N corpus lines")
    p.add_argument("--protect", help="text whose tokenization must not change (e.g. source-language text)")
    p.add_argument(
        "--scripts",
        default="auto",
        help="writing systems new tokens must use: auto (the corpus's dominant ones, e.g. DEVANAGARI), any, "
        "or a comma list of Unicode name prefixes such as GREEK or HIRAGANA,KATAKANA,CJK",
    )
    add_surgery_arg(p)
    add_keep_marks_arg(p, "the expanded tokenizer's split regex (byte-level BPE sources)")
    p.add_argument("--heldout", help="held-out text: report tokens/line before/after and new-token usage")
    p.add_argument("--eval-limit", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_expand)

    p = sub.add_parser("replace", help="replace the tokenizer with a target-language one and initialize the new rows")
    add_model_arg(p)
    p.add_argument("--corpus", required=True, help="target-language training text (tokenizer, FOCUS, Align...)")
    p.add_argument("--field", default="text")
    p.add_argument("--tokenizer", help="the target tokenizer (default: train one on --corpus)")
    p.add_argument(
        "--kind",
        choices=["bytelevel-bpe", "sp-bpe", "sp-unigram"],
        help="kind of the trained target tokenizer (default: the source's family)",
    )
    p.add_argument("--vocab-size", type=int, default=50000, help="size of the trained target tokenizer")
    add_keep_marks_arg(p, "the split regex of a trained byte-level target tokenizer")
    add_init_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--sample", type=int, help="use a seeded sample of N corpus lines")
    add_surgery_arg(p)
    p.add_argument("--heldout", help="held-out text: report tokens/line before/after")
    p.add_argument("--eval-limit", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_replace)

    p = sub.add_parser("plm", help="a small target-language LM (SALT's target PLM when none can be downloaded)")
    psub = p.add_subparsers(dest="plm_command", required=True)
    t = psub.add_parser("train", help="train a small GPT-2-style LM from scratch with the target tokenizer")
    t.add_argument("--corpus", required=True)
    t.add_argument("--tokenizer", required=True, help="the target tokenizer (a directory)")
    t.add_argument("--out", required=True)
    t.add_argument("--minutes", type=float, default=5.0, help="time budget")
    t.add_argument("--steps", type=int, help="step budget (whichever runs out first)")
    t.add_argument("--max-lines", type=int)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--overwrite", action="store_true")
    add_device_args(t, dtype=False)  # a small model trained from scratch: float32
    t.set_defaults(func=cmd_plm_train)

    p = sub.add_parser("train", help="language-adaptive pre-training (LAPT) of a model on the target corpus")
    add_train_args(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser(
        "vocadt", help="replace the tokenizer; learn new embeddings as adapters over the frozen model (VocADT)"
    )
    add_train_args(p, strategies=False, lr=VOCADT_LR)
    p.add_argument("--tokenizer", help="the target tokenizer (default: train one on the --corpus mix)")
    p.add_argument("--kind", choices=["bytelevel-bpe", "sp-bpe", "sp-unigram"], help="kind of the trained tokenizer")
    p.add_argument("--vocab-size", type=int, default=50000, help="size of the trained target tokenizer")
    p.add_argument(
        "--alpha", type=float, default=0.1, help="aux-loss weight keeping shared tokens' rows near their start "
        "(paper 004: 0.1 for non-Latin scripts, 0 for Latin)"
    )  # fmt: skip
    form = p.add_mutually_exclusive_group()
    form.add_argument("--max-candidates", type=int, default=64, help="K nearest old rows per new row (sparse form)")
    form.add_argument("--dense", action="store_true", help="a full |Vnew| x |Vold| adapter (large GPUs only)")
    p.add_argument(
        "--adapters", choices=["separate", "shared"], default="separate", help="separate input and output adapters "
        "(paper 004's form; a tied source is saved untied) or one adapter on both sides (a tied source stays tied)"
    )  # fmt: skip
    p.set_defaults(func=cmd_vocadt)

    p = sub.add_parser("downstream", help="generation speed, MT chrF and NLI/SUM/SPAN scores (vs a baseline model)")
    p.add_argument("--model", required=True, help="the adapted model")
    p.add_argument("--baseline", help="its source model, measured in the same run")
    p.add_argument("--lang", required=True, help="target language code (prompt templates, MT language name)")
    p.add_argument("--prompts", help="text whose lines' beginnings are generation prompts (speed, new-token share)")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=64, help="generation speed: tokens per prompt")
    p.add_argument("--mt", help="parallel english<TAB>target file, e.g. ../shared/corpora/parallel/en-el.tsv")
    p.add_argument("--mt-directions", nargs="+", default=["en-xx", "xx-en"], choices=["en-xx", "xx-en"])
    p.add_argument("--shots", type=int, default=3, help="MT examples in the prompt (the file's first pairs)")
    p.add_argument("--mt-limit", type=int, default=50, help="MT test pairs (after the examples)")
    p.add_argument("--mt-max-new-tokens", type=int, default=256, help="MT answer budget (stops at a line break)")
    p.add_argument("--mt-template", help="default: 'Translate {source_language} to {target_language}: {source} ='")
    p.add_argument("--task", action="append", help="TASK=FILE with TASK nli, sum or span (JSONL); repeatable")
    p.add_argument("--templates", help="JSON {task: template, 'nli_labels': [...]} overriding the shipped ones")
    p.add_argument("--json", help="also write everything (every MT hypothesis too) to this JSON file (- for stdout)")
    add_device_args(p)
    p.set_defaults(func=cmd_downstream)

    p = sub.add_parser("export", help="write a model for another engine")
    esub = p.add_subparsers(dest="export_command", required=True)
    e = esub.add_parser("gguf", help="one .gguf file for llama.cpp, tokenizing exactly as the model's tokenizer does")
    e.add_argument("--model", required=True, help="a vocgraft output or a Llama/Qwen2 causal-LM directory")
    e.add_argument("--out", required=True, help="the .gguf file to write")
    e.add_argument("--outtype", default="f32", choices=["f32", "f16", "bf16", "q8_0"],
                   help="tensor type (1-D tensors and norms stay f32)")  # fmt: skip
    e.add_argument(
        "--text", help="text to measure a refused tokenizer on (default: the output's held-out text, if its "
        "manifest names the corpus)"
    )  # fmt: skip
    e.add_argument(
        "--force-pre", metavar="TYPE", help="write this llama.cpp pre-tokenizer type although llama.cpp will "
        "tokenize some text differently (the refusal names the nearest type and how much)"
    )  # fmt: skip
    e.add_argument("--overwrite", action="store_true", help="replace a .gguf file vocgraft wrote")
    e.set_defaults(func=cmd_export_gguf)

    p = sub.add_parser("run", help="the whole pipeline from a YAML config; finished stages are reused")
    p.add_argument("config", help="YAML config (see examples/)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("sweep", help="the pipeline over k x init (x |D|), with report.md, plots and a recommendation")
    p.add_argument("config", help="YAML config (see examples/); the grid overrides adapt.new_tokens / adapt.init")
    p.add_argument("--k", help="new-token counts, e.g. 50,100,500,1000,5000")
    p.add_argument("--init", help="init methods, e.g. random,mean,align")
    p.add_argument("--sizes", help="LAPT corpus sizes |D|, e.g. 2^10..2^15 (needs a train section)")
    p.add_argument("--tolerance", type=float, help="allowed relative bits/byte loss vs the source (default 0.02)")
    p.add_argument("--jobs", type=int, default=1, help="settings run in parallel processes")
    p.set_defaults(func=cmd_sweep)
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
