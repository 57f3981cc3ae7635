"""GPU benchmark: roofline, LAPT (trainer vs a bare loop), eval throughput, with peak GPU memory, in one script.

Made to run on a lent GPU machine within a few minutes (no network: the tokenizer and corpora are given as paths).
Arms, in the order they run (the most wanted first, so a ``--budget-seconds`` stop loses the least):

1. ``roofline``: ``roofline_lib``'s model-shaped matmuls in float32, TF32 and bfloat16 (short repeats); also
   written to ``roofline_gpu.{json,md}``. Every arm below divides its achieved FLOP/s by this run's figure.
2. ``eval``: ``vocgraft.eval.bits_per_byte`` on ``--eval-lines`` held-out lines (after an untimed warm-up on
   8 lines), in the dtype ``auto`` chooses and, for a float32 checkpoint, in bfloat16 too.
3. ``lapt``: ``vocgraft.train.lapt.train`` (mixed precision auto: bf16 autocast on a GPU) against a bare loop on the
   same packed chunks and batch order (``lapt_speed.training_chunks``; forward, loss, backward, clipping, AdamW over
   the strategy's parameters, under the same autocast and with the trainer's dtypes: trained weights float32,
   frozen ones as loaded). Per strategy and objective; which side runs first alternates. The first
   ``--untimed-steps`` steps are not timed (allocator, autotuning). The trainer's per-step seconds come from its
   log, so loading, packing, validation and saving are reported apart; its clock stops before the step's loss is
   read, i.e. before the GPU has finished, so this benchmark syncs at that point (``synced_reduce``) and reports
   what the unsynced log would have said beside it.
4. optional (``--distill``): distillation init (``distill_merge: all``) of SmolLM2 expanded by k tokens, through
   the library as ``benchmarks/distill.py`` runs it, with its parts' seconds and held-out bits/byte.
5. optional (``--vocadt``): VocADT's nearest-row search (``vocgraft.train.vocadt.nearest_rows``: a bfloat16
   shortlist settled in float32, the exact search's neighbours; K=64) of
   128,256 start rows among 128,256 old rows of width 4096 (Llama-3 8B's matrices; random values, one matrix:
   a Llama-3 replacement searches two).

On two models: SmolLM2 ("small": ``--model``, default the packaged ``smollm2``; or ``--model-shape DIR``, random
weights of the config and tokenizer in DIR, which ``--export-shape DIR`` writes from ``--model``: 3.5 MB where the
GGUF file is 94 MiB) and ("big") a random Llama of Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV
heads, MLP 8192, vocabulary 128,256, tied, bfloat16) saved with ``--tokenizer`` to a temporary folder. Random
weights run at the speed and memory of trained ones; their bits/byte is noise.

FLOP model (per token): each ``nn.Linear`` of N weights costs 2N forward, 2N backward for the gradient of its input
(every strategy trains the embeddings, so gradients flow to the bottom) and 2N more for its weight's gradient when
the weight trains; MTP adds one trained V x h head. Causal attention adds 2 * seq * (heads x head_dim) per layer
forward (QK^T and AV at the mean context seq/2) and twice that backward. Embedding lookups, norms, activations,
softmax and the optimizer are not counted. Eval: the forward part, at the mean window length.

Each arm runs in a try: a failure is recorded (type, message, traceback tail) and the rest go on. The JSON is
written after every arm; ``--resume`` keeps the arms a previous run finished (``ok``) and runs the others.
Peak GPU memory is ``torch.cuda.max_memory_allocated`` with the peak reset before each arm.

    .venv/bin/python benchmarks/gpu.py --export-shape .gpu/smollm2-shape      # here: SmolLM2 without weights
    python3 benchmarks/gpu.py --model-shape .gpu/smollm2-shape --tokenizer .gpu/llama3 \
        --corpus .gpu/el/train.txt --heldout .gpu/el/heldout.txt --results $OUT   # on the GPU machine
    .venv/bin/python benchmarks/gpu.py --smoke --device cpu   # the CPU check: tiny random models, 3 steps
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

# a lent GPU machine has no network: never wait for the hub (read when huggingface_hub is imported)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import roofline  # noqa: E402
import roofline_lib  # noqa: E402
import torch  # noqa: E402
from lapt_speed import training_chunks  # noqa: E402

from vocgraft.corpus import SHARED_CORPORA, read_lines  # noqa: E402
from vocgraft.outdir import write_json  # noqa: E402
from vocgraft.report import markdown_table  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHARED_TOKENIZERS = SHARED_CORPORA.parent / "tokenizers"
START = time.perf_counter()
# Llama-3.2-1B's shape (vocabulary: the tokenizer's when it is larger)
BIG = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
       "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": True, "rope_theta": 500000.0}  # fmt: skip
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 0, "rope_theta": 10000.0}  # fmt: skip
FLOP_MODEL = (
    "per token: each nn.Linear of N weights 2N forward + 2N backward to its input (embeddings always train, so "
    "gradients reach the bottom) + 2N for its weight's gradient when it trains; MTP adds a trained V x h head; causal "
    "attention 2*seq*heads*head_dim per layer forward (mean context seq/2), twice that backward; embedding lookups, "
    "norms, activations, softmax and the optimizer uncounted. Eval: the forward part at the mean window length."
)


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {message}", flush=True)


# ----------------------------------------------------------------------------------------------------------
# models


def build_random_model(
    shape: dict | str, tokenizer_dir: str, out: Path, dtype: torch.dtype | None, device: torch.device
) -> dict:
    """A causal LM with random weights, saved to ``out`` with the tokenizer of ``tokenizer_dir``: a Llama of
    ``shape`` (LlamaConfig fields; the vocabulary grows to the tokenizer's), or the architecture of the folder
    ``shape`` names (its config.json; ``dtype`` None: the config's own dtype). Initialized on ``device`` (seconds
    on a GPU instead of a minute on a CPU). Same speed and memory as trained weights; bits/byte of noise."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if isinstance(shape, dict):
        config = LlamaConfig(**{**shape, "vocab_size": max(shape["vocab_size"], len(tokenizer))},
                             max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    else:
        config = AutoConfig.from_pretrained(shape)
    if dtype is None:
        stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        dtype = getattr(torch, stored) if isinstance(stored, str) else stored
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(before)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    del model
    return {"path": str(out), "random_weights": True, "shape_from": shape if isinstance(shape, str) else "Llama",
            "parameters": params, "vocab": config.vocab_size, "dtype": str(dtype).removeprefix("torch."),
            "tied": tied, "seconds": time.perf_counter() - start}  # fmt: skip


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def export_shape(spec: str, folder: Path) -> None:
    """Copy ``spec``'s config and tokenizer files, without its weights, to ``folder``: what ``--model-shape``
    needs on a machine the weights cannot travel to (the packaged SmolLM2 GGUF file is 94 MiB)."""
    from vocgraft.models import resolve

    source = Path(resolve(spec))
    folder.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES) and "index" not in file.name:
            shutil.copy2(file, folder / file.name)
    print(f"wrote {', '.join(sorted(p.name for p in folder.iterdir()))} to {folder}")


def flops_per_token(model_dir: str, strategy: str | None, objective: str, context: float) -> dict:
    """FLOPs per token of one training step (``strategy`` given) or forward (None), by :data:`FLOP_MODEL`, from
    the model's config (a meta-device copy: no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from vocgraft.train.strategies import configure

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if strategy is not None:
        model = configure(model, strategy)
    linears = [(m.in_features * m.out_features, m.weight.requires_grad)
               for m in model.modules() if isinstance(m, torch.nn.Linear)]  # fmt: skip
    if objective == "mtp" and strategy is not None:
        head = model.get_output_embeddings().weight
        linears.append((head.shape[0] * head.shape[1], True))
    n_all = sum(n for n, _ in linears)
    n_trained = sum(n for n, trains in linears if trains) if strategy is not None else 0
    heads = config.num_attention_heads
    width = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    attention = config.num_hidden_layers * 2 * context * width
    forward = 2 * n_all + attention
    total = forward if strategy is None else forward + 2 * n_all + 2 * n_trained + 2 * attention
    return {"per_token": total, "linear_weights": n_all, "trained_linear_weights": n_trained,
            "attention_per_token": attention * (1 if strategy is None else 3)}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# measurements


class Bench:
    """The run's state: settings, the report, the models made on the way, the roofline measured."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.scratch = Path(tempfile.mkdtemp(prefix="vocgraft-gpu-bench-"))
        self.models: dict[str, str] = {}  # key -> model directory
        self.report: dict = {}

    def model_dir(self, key: str) -> str:
        """The model directory of ``key`` ("small" or "big"), made (or converted) on first use."""
        if key in self.models:
            return self.models[key]
        from vocgraft.models import resolve

        a, start = self.args, time.perf_counter()
        if key == "small" and a.model_shape:
            facts = build_random_model(a.model_shape, a.model_shape, self.scratch / key, None, self.device)
        elif key == "small" and a.model:
            facts = {"spec": a.model, "path": resolve(a.model)}  # the packaged alias: its GGUF converted once
            facts["seconds"] = time.perf_counter() - start
        else:
            shape = BIG if (key == "big" and not a.smoke) else {**TINY, "tie_word_embeddings": key == "big"}
            dtype = torch.bfloat16 if key == "big" else torch.float32
            facts = build_random_model(shape, a.tokenizer, self.scratch / key, dtype, self.device)
        path = facts["path"]
        self.report["models"][key] = facts
        self.models[key] = path
        return path

    def roofline_gflops(self, dtype: str, model_key: str, kind: str) -> float | None:
        """This run's roofline for ``dtype``: the step figure of ``model_key``'s shapes ("small", "big" or a
        ``roofline_lib.MODELS`` key) where measured (not for the smoke's tiny models), else the device's."""
        shapes = None if self.args.smoke else {"small": "smollm2", "big": "llama-1b"}.get(model_key, model_key)
        entry = self.report.get("roofline", {}).get(dtype)
        if entry is None:  # no roofline arm in this run: the last one measured on this kind of device
            return roofline_lib.load_roofline(self.device.type, dtype, model=shapes, kind=kind)
        models = entry.get("models", {})
        return models[shapes][f"{kind}_gflops"] if shapes in models else entry["gflops"]

    def matmul_dtype(self, compute: str, mixed: str) -> str:
        if mixed == "bf16":
            return "bfloat16"
        if compute == "float32" and self.device.type == "cuda":
            return "tf32" if torch.get_float32_matmul_precision() != "highest" else "float32"
        return compute


def arm_roofline(bench: Bench) -> dict:
    a = bench.args
    dtypes = list(roofline_lib.DTYPES[bench.device.type])
    ns = argparse.Namespace(models=list(roofline_lib.MODELS), dtypes=dtypes, repeats=3, min_seconds=0.01,
                            tokens=None, threads=torch.get_num_threads(), quick=False)  # fmt: skip
    if a.smoke:
        ns.models, ns.repeats, ns.min_seconds, ns.tokens = ["smollm2"], 1, 0.0, 32
    result = roofline.run(bench.device, ns, log=lambda m: None)
    if bench.device.type == "cuda":
        roofline.write(result, Path(a.results) / "roofline_gpu")
    bench.report["roofline"] = result["roofline"]
    return {dtype: {"gflops": e["gflops"], **{m: v["train_gflops"] for m, v in e["models"].items()}}
            for dtype, e in result["roofline"].items()}  # fmt: skip


def arm_eval(bench: Bench, key: str, dtype: str) -> dict:
    from vocgraft.checkpoint import stored_dtype
    from vocgraft.devices import DTYPES, choose_dtype, dtype_name
    from vocgraft.eval import bits_per_byte
    from vocgraft.models import dtype_choice_of, load_model

    a = bench.args
    path = bench.model_dir(key)
    if dtype != "auto" and choose_dtype("auto", stored_dtype(path), bench.device).compute == DTYPES[dtype]:
        return {"skipped": f"auto already computes in {dtype}"}
    model, tokenizer = load_model(path, dtype, bench.device)
    compute = dtype_name(dtype_choice_of(model).compute)
    lines = read_lines(a.heldout, limit=a.eval_lines)
    bits_per_byte(model, tokenizer, lines[:8], show_progress=False)  # warm-up: kernels, allocator
    sync(bench.device)
    result = bits_per_byte(model, tokenizer, lines, show_progress=False)
    sync(bench.device)
    windows = len(lines)  # lines shorter than the window: one window each (longer ones add a few)
    flops = flops_per_token(path, None, "clm", result["forward_tokens"] / max(windows, 1))
    achieved = flops["per_token"] * result["forward_tokens"] / result["seconds"]
    peak = bench.roofline_gflops(bench.matmul_dtype(compute, "no"), key, "forward")
    return {
        "compute_dtype": compute,
        "lines": len(lines),
        "bytes": result["bytes"],
        "forward_tokens": result["forward_tokens"],
        "seconds": result["seconds"],
        "tokens_per_second": result["forward_tokens"] / result["seconds"],
        "bytes_per_second": result["bytes"] / result["seconds"],
        "bits_per_byte": result["bits_per_byte"],
        "uniform_bits_per_byte": result["uniform_bits_per_byte"],
        "padding_share": result["padding_share"],
        "flops_per_token": flops["per_token"],
        "achieved_tflops": achieved / 1e12,
        "roofline_gflops": peak,
        "roofline_fraction": achieved / (peak * 1e9) if peak else None,
    }


def arm_trainer(bench: Bench, key: str, strategy: str, objective: str) -> dict:
    from vocgraft.train.lapt import TrainConfig, train

    a = bench.args
    out = bench.scratch / "trainer-out"
    config = TrainConfig(
        model=bench.model_dir(key), corpus=a.corpus, out=str(out), strategy=strategy, objective=objective,
        seq_len=a.seq_len, batch_size=a.batch_size, max_steps=a.steps, lr=a.lr, sample=a.lines,
        val_lines=a.val_lines, eval_every=a.steps, seed=a.seed, show_progress=False, overwrite=True,
        device=a.device, mixed_precision="auto",
    )  # fmt: skip
    with synced_reduce(bench.device) as waits:
        summary = train(config)
    steps = json.loads((out / "train_log.json").read_text(encoding="utf-8"))["steps"]
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(f"{out}.checkpoints", ignore_errors=True)
    compute = summary["precision"]["compute"]
    # reduce runs for the validation at step 0, then once per step (the last step's validation comes after it)
    step_waits = waits[1 : 1 + len(steps)]
    as_logged = [s["seconds"] - w for s, w in zip(steps, step_waits)] if len(step_waits) == len(steps) else []
    tokens = a.batch_size * a.seq_len
    extra = {"wall_seconds": summary["wall_seconds"], "train_seconds": summary["train_seconds"],
             "trainable_parameters": summary["trainable_parameters"], "mixed_precision": summary["mixed_precision"],
             "compute_dtype": compute, "val_loss_start": summary["val_loss_start"],
             "sync_wait_seconds": [round(w, 4) for w in step_waits],
             "unsynced_tokens_per_second": tokens / statistics.median(as_logged[a.untimed_steps :] or as_logged)
             if as_logged else None}  # fmt: skip
    losses = [s["loss"] for s in steps]
    return step_result(bench, key, strategy, objective, [s["seconds"] for s in steps], losses, compute,
                       summary["mixed_precision"], extra)  # fmt: skip


@contextlib.contextmanager
def synced_reduce(device: torch.device):
    """Make the trainer's per-step seconds wall time on a GPU; yields the seconds each sync waited.

    The trainer stops a step's clock right after ``accelerator.reduce`` of the step's losses and reads them (the
    first sync) only afterwards, so on a GPU its logged seconds end while the GPU still computes the step and the
    wait is counted nowhere. A sync at the end of ``reduce`` moves that wait inside the clock and adds none (the
    loss read syncs right after anyway). The waits also give what the unpatched log would have said."""
    from accelerate import Accelerator

    original, waits = Accelerator.reduce, []

    def reduce(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        start = time.perf_counter()
        sync(device)
        waits.append(time.perf_counter() - start)
        return result

    Accelerator.reduce = reduce
    try:
        yield waits
    finally:
        Accelerator.reduce = original


def arm_bare(bench: Bench, key: str, strategy: str, objective: str) -> dict:
    """The plainest correct loop on the trainer's batches, dtypes and autocast."""
    from vocgraft.devices import dtype_name, frozen_dtype, training_precision
    from vocgraft.models import dtype_choice_of, load_model
    from vocgraft.train.data import BatchOrder
    from vocgraft.train.objectives import next_token_loss
    from vocgraft.train.strategies import configure

    a, device = bench.args, bench.device
    model, tokenizer = load_model(bench.model_dir(key), "auto", device)
    compute = dtype_choice_of(model).compute
    mixed = training_precision(compute, device, "auto")
    if mixed == "fp16":
        raise NotImplementedError("the bare loop has no fp16 gradient scaler; this model trains with fp16 autocast")
    model = configure(model, strategy)
    frozen = frozen_dtype(compute, mixed, False)
    for param in model.parameters():  # as the trainer holds them: trained weights float32 (AdamW's master copy)
        want = torch.float32 if param.requires_grad else frozen
        if param.is_floating_point() and param.dtype != want:
            param.data = param.data.to(want)
    chunks = training_chunks(tokenizer, a, a.corpus, a.seq_len)
    order = BatchOrder(len(chunks), a.batch_size, a.seed)
    head = None
    if objective == "mtp":
        weight = model.get_output_embeddings().weight
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=device)
        head.weight.data.copy_(weight.data.float())
    params = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if head else [])
    optimizer = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if mixed == "bf16" else contextlib.nullcontext()
    model.train()
    times, losses = [], []
    for step in range(a.steps):
        tick = time.perf_counter()
        batch = chunks[order.indices(step)].to(device=device, dtype=torch.long)
        with autocast:
            out = model(input_ids=batch, output_hidden_states=head is not None)
            loss = next_token_loss(out.logits[:, :-1], batch[:, 1:])
            if head is not None:
                loss = loss + next_token_loss(head(out.hidden_states[-1][:, :-2]), batch[:, 2:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(float(loss.detach()), 5))  # a loss read: the GPU has finished the step
        times.append(time.perf_counter() - tick)
    trainable = sum(p.numel() for p in params)
    return step_result(bench, key, strategy, objective, times, losses, dtype_name(compute), mixed,
                       {"trainable_parameters": trainable})  # fmt: skip


def step_result(bench, key, strategy, objective, times, losses, compute, mixed, extra) -> dict:
    a = bench.args
    timed = times[a.untimed_steps :] or times
    median = statistics.median(timed)
    tokens = a.batch_size * a.seq_len
    flops = flops_per_token(bench.model_dir(key), strategy, objective, a.seq_len)
    achieved = flops["per_token"] * tokens / median
    peak = bench.roofline_gflops(bench.matmul_dtype(compute, mixed), key, "train")
    return {
        "steps": len(times),
        "timed_steps": len(timed),
        "median_step_seconds": median,
        "min_step_seconds": min(timed),
        "max_step_seconds": max(timed),
        "tokens_per_second": tokens / median,
        "flops_per_token": flops["per_token"],
        "achieved_tflops": achieved / 1e12,
        "roofline_gflops": peak,
        "roofline_fraction": achieved / (peak * 1e9) if peak else None,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "step_seconds": [round(t, 4) for t in times],
        **extra,
    }


def arm_distill(bench: Bench, k: int) -> dict:
    """Distillation init of the small model expanded by ``k`` tokens, as ``benchmarks/distill.py`` runs it."""
    from vocgraft.eval import bits_per_byte
    from vocgraft.init import method_options
    from vocgraft.models import load_model
    from vocgraft.plan import VocabPlan
    from vocgraft.recipes.common import init_and_graft, method_stats
    from vocgraft.recipes.expand import train_aux_tokenizer
    from vocgraft.tokenization import expand_tokenizer
    from vocgraft.tokenization.scripts import dominant_scripts

    a = bench.args
    start = time.perf_counter()
    model, source_tokenizer = load_model(bench.model_dir("small"), "auto", bench.device)
    train = read_lines(a.corpus, limit=a.distill_lines)
    aux = train_aux_tokenizer(source_tokenizer, train, a.aux_vocab_size)
    tokenizer = expand_tokenizer(source_tokenizer, aux, train, k, scripts=dominant_scripts(train)).tokenizer
    plan = VocabPlan.from_tokenizers(source_tokenizer, tokenizer, "expand")
    prepare = time.perf_counter() - start
    options = method_options("distill", {"distill_merge": "all"})
    seconds, resources = init_and_graft(model, plan, source_tokenizer, tokenizer, "distill", corpus=train,
                                        aux_tokenizer=aux, options=options)  # fmt: skip
    heldout = read_lines(a.heldout, limit=a.eval_lines)
    bpb = bits_per_byte(model, tokenizer, heldout, show_progress=False, new_token_ids=set(plan.new_ids))
    return {"k": len(plan.new_ids), "init_seconds": seconds, "prepare_seconds": prepare,
            "stats": method_stats(resources), "bits_per_byte": bpb["bits_per_byte"],
            "argmax_new_share": bpb.get("argmax_new_share")}  # fmt: skip


def arm_vocadt(bench: Bench) -> dict:
    """VocADT's nearest-row search at Llama-3 8B's size (random rows: the time hardly depends on them)."""
    from vocgraft.train.vocadt import nearest_rows

    a, device = bench.args, bench.device
    rows, width, k = (2048, 64, 16) if a.smoke else (128256, 4096, 64)
    generator = torch.Generator(device=device).manual_seed(0)
    keys = torch.randn(rows, width, generator=generator, device=device).to(torch.bfloat16)  # the stored matrix
    queries = torch.randn(rows, width, generator=generator, device=device)
    exclude = torch.randint(0, rows, (rows, 4), generator=generator, device=device)
    sync(device)
    start = time.perf_counter()
    found = nearest_rows(queries, keys, k, exclude=exclude)
    sync(device)
    seconds = time.perf_counter() - start
    flops = 2 * rows * rows * width
    # its shortlist's blocks are 8B-head-shaped products (start rows x width @ width x old rows), in bfloat16
    peak = bench.roofline_gflops("bfloat16", "llama3-8b-head", "forward")
    return {"queries": rows, "keys": rows, "width": width, "k": k, "seconds": seconds, "shape": list(found.shape),
            "achieved_tflops": flops / seconds / 1e12, "roofline_gflops": peak,
            "roofline_fraction": flops / seconds / (peak * 1e9) if peak else None,
            "both_matrices_seconds": 2 * seconds}  # fmt: skip


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------------------
# the run


def plan_arms(args) -> list[tuple[str, callable]]:
    """(name, function of the Bench) in the order they run."""
    arms = [("roofline", arm_roofline)]
    for key in ("small", "big"):
        for dtype in ("auto", "bfloat16"):
            arms.append((f"eval {key} {dtype}", lambda b, key=key, dtype=dtype: arm_eval(b, key, dtype)))
    for strategy in args.strategies:
        for key in ("small", "big"):
            for i, objective in enumerate(args.objectives):
                sides = ("trainer", "bare") if i % 2 == 0 else ("bare", "trainer")  # alternate who goes first
                for side in sides:
                    fn = arm_trainer if side == "trainer" else arm_bare
                    arms.append((f"lapt {key} {strategy} {objective} {side}",
                                 lambda b, fn=fn, k=key, s=strategy, o=objective: fn(b, k, s, o)))  # fmt: skip
    if args.distill:
        for k in args.distill_ks:
            arms.append((f"distill small k={k}", lambda b, k=k: arm_distill(b, k)))
    if args.vocadt:
        arms.append(("vocadt nearest rows", arm_vocadt))
    return arms


def summary_line(name: str, arm: dict) -> str:
    if arm["status"] != "ok":
        return f"{name}: {arm['status']} {arm.get('error', '')}"
    r, mem = arm["result"], arm.get("peak_gpu_gib")
    memory = f", peak {mem:.1f} GiB" if mem is not None else ""
    frac = r.get("roofline_fraction")
    share = f" ({frac:.0%} of roofline)" if isinstance(frac, float) else ""
    if "tokens_per_second" in r and "steps" in r:
        return (
            f"{name}: {r['tokens_per_second']:.0f} tokens/s, {r['median_step_seconds']:.3f} s/step, "
            f"{r['achieved_tflops']:.2f} TFLOP/s{share}{memory}, loss {r['first_loss']} -> {r['last_loss']}"
        )
    if "bytes_per_second" in r:
        return (
            f"{name}: {r['tokens_per_second']:.0f} tokens/s, {r['bytes_per_second']:.0f} bytes/s, "
            f"{r['achieved_tflops']:.2f} TFLOP/s{share}, {r['bits_per_byte']:.3f} bits/byte{memory}"
        )
    if name == "roofline":
        return "roofline: " + ", ".join(f"{d} {v['gflops']:.0f} GFLOP/s" for d, v in r.items()) + f"{memory}"
    if "skipped" in r:
        return f"{name}: skipped ({r['skipped']})"
    brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, dict)}
    return f"{name}: {brief}{memory} ({arm['seconds']:.1f} s)"


def run_arm(bench: Bench, name: str, fn) -> dict:
    device = bench.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    arm: dict = {"started_at_seconds": round(start - START, 1)}
    if device.type == "cuda":  # what an earlier arm left allocated (none, unless something leaks)
        arm["gpu_allocated_before_gib"] = torch.cuda.memory_allocated(device) / 2**30
    try:
        arm |= {"status": "ok", "result": fn(bench)}
    except Exception as exc:  # one arm's failure is a result; the others still run
        arm |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:600],
                "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
    arm["seconds"] = time.perf_counter() - start
    if device.type == "cuda":
        arm["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        arm["peak_gpu_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    from vocgraft.train.lapt import peak_rss_mib

    arm["process_peak_rss_mib"] = peak_rss_mib()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return arm


def ratios(report: dict) -> dict:
    """trainer / bare tokens/s and MTP's cost per step, wherever both arms finished."""
    arms = {n: a["result"] for n, a in report["arms"].items() if a["status"] == "ok" and "steps" in a["result"]}
    out = {}
    for name, r in arms.items():
        if name.endswith(" trainer"):
            bare = arms.get(name.removesuffix(" trainer") + " bare")
            if bare:
                out[name.removesuffix(" trainer") + " trainer/bare"] = (
                    r["tokens_per_second"] / bare["tokens_per_second"]
                )
        if " mtp " in name:
            clm = arms.get(name.replace(" mtp ", " clm "))
            if clm:
                out[name.replace(" mtp ", " ") + " mtp cost"] = (
                    r["median_step_seconds"] / clm["median_step_seconds"] - 1
                )
    return out


def write_markdown(report: dict, path: Path) -> None:
    a, m = report["args"], report["machine"]
    lapt, evals, other, failed = [], [], [], []
    for name, arm in report["arms"].items():
        mem = arm.get("peak_gpu_gib", "–")
        if arm["status"] != "ok":
            failed.append([name, arm["status"], arm.get("error", "")])
            continue
        r = arm["result"]
        if name.startswith("lapt"):
            _, key, strategy, objective, side = name.split()
            lapt.append([key, strategy, objective, side, r["timed_steps"], r["median_step_seconds"],
                         r["tokens_per_second"], r["achieved_tflops"], _fmt(r["roofline_fraction"]), mem,
                         r["first_loss"], r["last_loss"], r.get("wall_seconds", "–"),
                         _fmt(r.get("unsynced_tokens_per_second"))])  # fmt: skip
        elif "skipped" in r:
            failed.append([name, "skipped", r["skipped"]])
        elif name.startswith("eval"):
            evals.append([name.split()[1], r["compute_dtype"], r["lines"], r["forward_tokens"], r["seconds"],
                          r["tokens_per_second"], r["bytes_per_second"], r["achieved_tflops"],
                          _fmt(r["roofline_fraction"]), r["bits_per_byte"], mem])  # fmt: skip
        elif name != "roofline":
            other.append([name, arm["seconds"], mem, json.dumps(r, default=str)[:400]])
    gpu = m.get("gpu") or f"{m['cpu']} (CPU)"
    models = "; ".join(
        f"{k}: {v.get('spec') or 'random weights, shape of ' + v['shape_from']} ({v.get('parameters', '?'):,} "
        f"parameters, {v.get('dtype', 'as stored')})"
        if "parameters" in v
        else f"{k}: {v['spec']} ({v['path']})"
        for k, v in report["models"].items()
    )
    text = [
        f"# GPU benchmark on {gpu}\n",
        f"{report['date']}; {m['cpu']}, {m['cores']} cores, torch {m['torch']}"
        f"{', CUDA ' + str(m.get('cuda')) if 'gpu' in m else ''}; device {report['device']}. Load average "
        f"{_load(report['load_before'])} before, {_load(report.get('load_after'))} after; "
        f"{report.get('wall_seconds', 0):.0f} s "
        f"in all{' (smoke: tiny random models)' if a['smoke'] else ''}.\n",
        f"Models: {models}. LAPT: seq {a['seq_len']}, batch {a['batch_size']}, {a['steps']} steps "
        f"(first {a['untimed_steps']} untimed), |D| {a['lines']} lines of {a['corpus']}, mixed precision auto. "
        f"Eval: {a['eval_lines']} lines of {a['heldout']}.\n",
        f"FLOP model: {FLOP_MODEL} Roofline: this run's model-shaped matmuls (roofline_gpu.md), the step figure "
        "of the model's shapes in the dtype the arm computes in (bf16 autocast: bfloat16).\n",
    ]
    if report.get("roofline"):
        rows = [[d, e["gflops"], *[e["models"].get(k, {}).get("train_gflops", "–") for k in roofline_lib.MODELS]]
                for d, e in report["roofline"].items()]  # fmt: skip
        text += ["## Roofline (GFLOP/s)\n", markdown_table(["dtype", "device", *roofline_lib.MODELS], rows, 1), ""]
    if lapt:
        header = ["model", "strategy", "objective", "side", "timed", "median s/step", "tokens/s", "TFLOP/s",
                  "of roofline", "peak GiB", "first loss", "last loss", "wall s", "as logged tokens/s"]  # fmt: skip
        text += ["## LAPT: trainer vs bare loop\n", markdown_table(header, lapt), ""]
        text += [
            "'wall s': the trainer's whole run (loading, packing, validation, saving). 'as logged tokens/s': "
            "what the trainer's own per-step seconds say without the sync this benchmark adds at the end of "
            "each step (the trainer stops its clock before the GPU finishes the step).\n"
        ]
        text += [f"- {k}: {v:.3f}" for k, v in report.get("ratios", {}).items()] + [""]
    if evals:
        header = ["model", "dtype", "lines", "tokens", "s", "tokens/s", "bytes/s", "TFLOP/s", "of roofline",
                  "bits/byte", "peak GiB"]  # fmt: skip
        text += ["## Eval throughput (bits/byte)\n", markdown_table(header, evals), ""]
    if other:
        text += ["## Other arms\n", markdown_table(["arm", "s", "peak GiB", "result"], other), ""]
    if failed:
        text += ["## Failed or skipped\n", markdown_table(["arm", "status", "error"], failed), ""]
    text += ["Command:\n", f"    python3 benchmarks/gpu.py {shlex.join(report.get('argv', []))}\n"]
    path.write_text("\n".join(text), encoding="utf-8")


def _load(load) -> str:
    return "–" if load is None else " / ".join(f"{v:.1f}" for v in load)


def _fmt(value):
    return "–" if value is None else value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --smoke)")
    p.add_argument("--model", default=None, help="the small model (default: the packaged smollm2; --smoke: tiny)")
    p.add_argument(
        "--model-shape",
        default=None,
        help="instead of --model: a folder with a config.json and tokenizer but no weights (made by "
        "--export-shape); the small model is random weights of that shape, in the config's dtype",
    )
    p.add_argument(
        "--export-shape",
        default=None,
        metavar="DIR",
        help="copy --model's config and tokenizer (no weights) to DIR for --model-shape, and exit",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder for the random 1B Llama: a byte-level one such as llama3's (the default, "
        "from the shared folder; --smoke: llama2's, whose 32K rows make the tiny models' head cheap)",
    )
    p.add_argument("--corpus", default=str(SHARED_CORPORA / "el" / "train.txt"))
    p.add_argument("--heldout", default=str(SHARED_CORPORA / "el" / "heldout.txt"))
    p.add_argument("--strategies", nargs="*", default=None, help="default: 2x2 full (--smoke: 2x2)")
    p.add_argument("--objectives", nargs="*", default=["clm", "mtp"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--untimed-steps", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lines", type=int, default=4096, help="|D|: corpus lines sampled for training")
    p.add_argument("--val-lines", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-lines", type=int, default=200)
    p.add_argument("--distill", action="store_true", help="also time distill init (off: minutes per k)")
    p.add_argument("--distill-ks", nargs="*", type=int, default=[1000])
    p.add_argument("--distill-lines", type=int, default=8192)
    p.add_argument("--aux-vocab-size", type=int, default=16000)
    p.add_argument("--vocadt", action="store_true", help="also time VocADT's nearest-row search at 128K x 4096")
    p.add_argument("--only", nargs="*", default=None, help="run only arms whose name starts with one of these")
    p.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="start no arm after this many seconds since the start (default 210; --smoke: 600)",
    )
    p.add_argument(
        "--results",
        default=None,
        help="folder for gpu.{json,md} and roofline_gpu.* (default: benchmarks/results; --smoke: a temp folder)",
    )
    p.add_argument("--resume", action="store_true", help="keep the arms --results/gpu.json finished")
    p.add_argument("--smoke", action="store_true", help="tiny random models, 3 steps, few lines (a CPU check)")
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if args.smoke:
        # the tiny models keep the tokenizer's 128K vocabulary: their head is most of the work, so few tokens
        args.steps, args.untimed_steps, args.seq_len, args.batch_size = 3, 1, 32, 2
        args.lines, args.val_lines, args.eval_lines = 100, 4, 4
        args.distill_lines, args.aux_vocab_size = 300, 600
        args.distill_ks = [min(k, 20) for k in args.distill_ks]
    elif args.model is None and not args.model_shape:
        args.model = "smollm2"
    if args.export_shape:
        export_shape(args.model, Path(args.export_shape))
        return
    if args.tokenizer is None:
        args.tokenizer = str(SHARED_TOKENIZERS / ("llama2" if args.smoke else "llama3"))
    if args.strategies is None:
        args.strategies = ["2x2"] if args.smoke else ["2x2", "full"]
    if args.budget_seconds is None:
        args.budget_seconds = 600 if args.smoke else 210
    if args.results is None:  # a smoke never replaces the measured results
        args.results = str(Path(tempfile.gettempdir()) / "vocgraft-gpu-smoke") if args.smoke else str(RESULTS)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA GPU here; use --device cpu (with --smoke on a CPU).")
    for flag in ("tokenizer", "corpus", "heldout"):
        if not Path(getattr(args, flag)).exists():
            sys.exit(
                f"--{flag} {getattr(args, flag)} does not exist; give the path (no shared folder on this machine?)."
            )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    bench = Bench(args)
    out = results / "gpu"
    old = json.loads(out.with_suffix(".json").read_text()) if args.resume and out.with_suffix(".json").exists() else {}
    report = bench.report
    report |= {
        "device": str(bench.device),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": roofline_lib.machine_facts(bench.device),
        "load_before": os.getloadavg(),
        "argv": sys.argv[1:],
        "args": vars(args),
        "flop_model": FLOP_MODEL,
        "models": {},
        "arms": {},
    }
    if old.get("roofline") and old.get("arms", {}).get("roofline", {}).get("status") == "ok":
        report["roofline"] = old["roofline"]
    log(f"device {bench.device} ({report['machine'].get('gpu', report['machine']['cpu'])}), torch {torch.__version__}")
    try:
        for name, fn in plan_arms(args):
            kept = old.get("arms", {}).get(name)
            if kept and kept["status"] == "ok":
                report["arms"][name] = kept | {"kept_from_earlier_run": True}
                log(f"{name}: kept from the earlier run")
                continue
            if args.only is not None and not any(name.startswith(p) for p in args.only):
                continue
            if time.perf_counter() - START > args.budget_seconds:
                report["arms"][name] = {"status": "skipped", "error": f"--budget-seconds {args.budget_seconds} ran out"}
                log(f"{name}: skipped, budget spent")
                continue
            arm = report["arms"][name] = run_arm(bench, name, fn)
            log(summary_line(name, arm))
            report["ratios"] = ratios(report)
            report["wall_seconds"] = time.perf_counter() - START
            write_json(out.with_suffix(".json"), report)
            write_markdown(report, out.with_suffix(".md"))
    finally:
        shutil.rmtree(bench.scratch, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    report["wall_seconds"] = time.perf_counter() - START
    report["ratios"] = ratios(report)
    write_json(out.with_suffix(".json"), report)
    write_markdown(report, out.with_suffix(".md"))
    for name, value in report["ratios"].items():
        log(f"{name}: {value:.3f}")
    failed = [n for n, a in report["arms"].items() if a["status"] == "failed"]
    log(f"wrote {out}.json and {out}.md; {len(report['arms'])} arms, {len(failed)} failed {failed or ''}")


if __name__ == "__main__":
    main()
