"""Language-adaptive pre-training (LAPT): continue training a (vocabulary-adapted) model on the target corpus.

    summary = train(TrainConfig(model="out/el-k1000", corpus="el/train.txt", out="out/el-k1000-lapt",
                                strategy="lora", objective="clm", seq_len=512, max_steps=1000))

The loop is plain PyTorch on ``accelerate``: one process, several GPUs or FSDP/DeepSpeed come from
``accelerate launch`` and its config, not from code here. Each process takes its slice of every global batch
(``BatchOrder``), so the data position of a run is just its step number.

Checkpoints (``<out>.checkpoints/step-N``) hold model, optimizer, scheduler and every process's RNG state, with a
manifest of their files' sizes and hashes (:mod:`vocgraft.train.checkpoints`); a run killed at any point continues
with ``resume=True`` from the newest checkpoint that is whole and ends with the same weights an uninterrupted run
would have. A full or read-only disk while writing a checkpoint or the model stops the run with a
:class:`~vocgraft.diskerrors.DiskError` that says what to free; the previous checkpoint stays usable. The final
directory (LoRA merged, MTP head dropped) loads with plain ``transformers`` and carries the training log
(``train_log.json``) and a loss-curve plot (``loss_curve.png``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import torch

from vocgraft import failpoints
from vocgraft.diskerrors import translate_disk_errors
from vocgraft.outdir import check_writable
from vocgraft.progress import progress
from vocgraft.settings.train import DEFAULT_EPOCHS, PAPERS, TRAIN
from vocgraft.train import checkpoints as ckpt
from vocgraft.train import new_rows
from vocgraft.train.checkpoints import SCHEDULER_FILE, STATE_FILE, remove_checkpoints  # noqa: F401 (re-exported)
from vocgraft.train.data import (
    JOINS,
    BatchOrder,
    TrainingError,
    pack_tokens,
    separator_ids,
    split_validation,
)
from vocgraft.train.objectives import OBJECTIVES, LMObjective
from vocgraft.train.recipe import with_recipe
from vocgraft.train.schedule import cosine_with_warmup, warmup_for
from vocgraft.train.strategies import base_model, configure, embedding_weights, phases, trainable_count

STEP = failpoints.register("lapt.step.before", "before each optimizer step (@N: the N-th this process takes)")
FINAL_BEFORE_SAVE = failpoints.register(
    "lapt.final.before_save", "the finished marker is written; the model is not yet saved to --out"
)
FINAL_AFTER_RENAME = failpoints.register(
    "lapt.final.after_rename", "the model is in --out; the checkpoints and the finished marker are still there"
)
FINAL_BEFORE_CLEANUP = failpoints.register(
    "lapt.final.before_cleanup", "before a finished run's checkpoints are removed"
)
# a resumed run must be the same run: these settings decide the batches, the schedule and the weights
RESUME_KEYS = (
    "model", "corpus", "strategy", "objective", "seq_len", "batch_size", "grad_accum", "epochs", "max_steps",
    "lr", "warmup_steps", "weight_decay", "stage1_share", "sample", "val_lines", "seed", "max_grad_norm", "adapter",
    "dtype", "mixed_precision", "max_tokens", "join", "new_rows_lr_scale", "new_rows_weight_decay",
)  # fmt: skip
# keys checkpoints made before they existed lack: what those runs used (lines were joined by EOS)
RESUME_DEFAULTS = {"dtype": "auto", "mixed_precision": "auto", "join": "eos", "new_rows_lr_scale": 1.0}
# what a checkpoint's trainer_state.json says of the autocast it trained under (accelerate's mixed_precision):
# ``auto`` resolves by the device, and a resumed run must keep what it began with
PRECISION_KEY = "mixed_precision_used"
UNRECORDED = "unrecorded"  # checkpoints of a vocgraft that did not record it


_default = TRAIN.default


@dataclass
class TrainConfig:
    model: str
    corpus: str | list  # a source, or [[source, weight], ...]: a weighted mixture (corpus.read_corpus)
    out: str
    # the recipe's settings default to the papers' recipe; it and the others are declared with their flags and
    # pipeline keys in vocgraft.settings.train
    strategy: str = PAPERS["strategy"]
    objective: str = PAPERS["objective"]
    seq_len: int = PAPERS["seq_len"]
    batch_size: int = PAPERS["batch_size"]  # per process and micro-batch; paper 000 Table 3
    grad_accum: int = _default("grad_accum")
    epochs: float = PAPERS["epochs"]  # may be fractional; the batch order starts a new shuffle each epoch
    max_steps: int | None = None  # optimizer updates; overrides epochs (equal updates for models of any tokenizer)
    max_tokens: int | None = None  # a budget in training tokens: max_tokens // tokens per update updates
    lr: float = PAPERS["lr"]
    warmup_steps: int = PAPERS["warmup_steps"]  # at most 10% of a phase's updates, at least 1 (schedule.py)
    weight_decay: float = PAPERS["weight_decay"]
    stage1_share: float = _default("stage1_share")  # two-stage: share of the steps that train embeddings + head
    join: str = _default("join")  # what joins corpus lines when packed: newline | eos | none (data.separator_ids)
    # the new vocabulary rows (the model's vocgraft-plan.json): lr = scale x the run's lr; weight decay (None: the
    # run's); new_rows.py
    new_rows_lr_scale: float = _default("new_rows_lr_scale")
    new_rows_weight_decay: float | None = _default("new_rows_weight_decay")
    recipe: str | None = None  # the recipe the settings came from (recorded; the settings themselves decide)
    sample: int | None = _default("sample")  # |D|: a seeded sample of this many corpus lines
    val_lines: int = _default("val_lines")  # held out from the corpus for the validation loss
    eval_every: int | None = _default("eval_every")  # default: 10 evaluations over the run
    save_every: int = _default("save_every")
    save_minutes: float | None = _default("save_minutes")  # also checkpoint after this much training time
    # a wall-clock time (time.time()) after which the run checkpoints and stops with TrainingStopped, to be
    # continued with resume=True: a run that must fit in a bounded session
    stop_at: float | None = None
    seed: int = _default("seed")
    max_grad_norm: float = _default("max_grad_norm")
    field: str = _default("field")
    overwrite: bool = _default("overwrite")
    resume: bool = _default("resume")
    checkpoint_dir: str | None = _default("checkpoint_dir")  # default: <out>.checkpoints
    keep_checkpoints: bool = _default("keep_checkpoints")
    show_progress: bool = True
    inputs: dict = dataclass_field(default_factory=dict)  # extra facts for the manifest
    adapter: dict | None = None  # VocADT's settings (alpha, candidates, ...): part of what a resume must match
    dtype: str = _default("dtype")  # the weights' dtype, loaded and saved (auto: as stored); trained: float32
    device: str = _default("device")  # auto: accelerate's (a GPU when there is one); `accelerate launch`: auto only
    mixed_precision: str = _default("mixed_precision")  # accelerate's autocast: devices.training_precision
    gradient_checkpointing: bool = _default("gradient_checkpointing")

    def __post_init__(self) -> None:
        if self.epochs is None:  # a recipe whose budget is another setting (settings/train.py): the default
            self.epochs = DEFAULT_EPOCHS

    def checkpoint_root(self) -> Path:
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(f"{self.out}.checkpoints")


def train_config(flags: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from a command's parsed flags by name (`vocgraft train`, `vocgraft vocadt`): ``corpus`` (one
    or more) with ``corpus_weights`` as the corpus spec, the settings a ``recipe`` decides filled in where unset.
    Flags that are no TrainConfig field are left out, and fields without a flag keep their defaults."""
    from vocgraft.corpus import corpus_spec

    names = TrainConfig.__dataclass_fields__.keys() - {"show_progress", "inputs", "corpus", "adapter"}
    names &= flags.keys()  # vocadt has no --strategy / --objective / --recipe
    settings = {name: flags[name] for name in names}
    if flags.get("recipe"):
        settings = with_recipe(flags["recipe"], settings)
    return TrainConfig(corpus=corpus_spec(flags["corpus"], flags.get("corpus_weights")), **settings)


@dataclass
class PreparedModel:
    """A model built in memory instead of loaded from ``config.model``: VocADT's source model with adapters."""

    model: Any
    tokenizer: Any
    extra_loss: Callable[[], torch.Tensor] | None = None  # added to the training loss (VocADT's aux loss)
    finalize: Callable[[Any], Any] | None = None  # trained model -> the plain model to save
    manifest: dict = dataclass_field(default_factory=dict)  # merged into the saved manifest
    extra_json: dict = dataclass_field(default_factory=dict)  # more JSON files for the saved directory


@dataclass
class RunState:
    """What a checkpoint records besides tensors: where the run is and what it has logged."""

    step: int = 0
    train_seconds: float = 0.0
    log: list[dict] = dataclass_field(default_factory=list)  # one entry per optimizer step
    val: list[dict] = dataclass_field(default_factory=list)  # {"step", "loss"}


def peak_rss_mib() -> float:
    """This process's peak resident memory. Linux's VmHWM belongs to the address space, so it starts afresh at
    exec; ``ru_maxrss`` would also count what a forking parent held (a benchmark spawning runs)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux; other systems differ


class TrainingStopped(Exception):
    """The run reached ``TrainConfig.stop_at``: a checkpoint holds its state, ``resume=True`` continues it."""

    def __init__(self, checkpoint: Path, step: int, total: int):
        super().__init__(f"stopped at step {step} of {total}; checkpoint {checkpoint} (continue with --resume)")
        self.checkpoint, self.step, self.total = checkpoint, step, total


def _check_config(config: TrainConfig) -> None:
    if config.objective not in OBJECTIVES:
        raise TrainingError(f"unknown objective {config.objective!r}; choose one of {', '.join(OBJECTIVES)}.")
    if config.save_minutes is not None and not (math.isfinite(config.save_minutes) and config.save_minutes > 0):
        raise TrainingError(f"--save-minutes must be a positive number; got {config.save_minutes}.")
    for name in ("seq_len", "batch_size", "grad_accum", "save_every", "val_lines"):
        if getattr(config, name) <= 0:
            raise TrainingError(f"--{name.replace('_', '-')} must be positive; got {getattr(config, name)}.")
    if config.seq_len < 2:  # one token has no next token to predict: every loss would be nan
        raise TrainingError(f"--seq-len must be at least 2; got {config.seq_len}.")
    for name in ("lr", "weight_decay", "max_grad_norm"):
        value = getattr(config, name)
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "weight_decay"):
            bound = ">= 0" if name == "weight_decay" else "> 0"
            raise TrainingError(f"--{name.replace('_', '-')} must be a finite number {bound}; got {value}.")
    if config.max_steps is None and config.epochs <= 0:
        raise TrainingError(f"--epochs must be positive; got {config.epochs}.")
    if config.max_steps is not None and config.max_steps <= 0:
        raise TrainingError(f"--max-steps must be positive; got {config.max_steps}.")
    if config.max_tokens is not None and config.max_tokens <= 0:
        raise TrainingError(f"--max-tokens must be positive; got {config.max_tokens}.")
    if config.max_steps is not None and config.max_tokens is not None:
        raise TrainingError("give one budget: --max-steps (updates) or --max-tokens (training tokens), not both.")
    if config.warmup_steps < 1:  # a first update at the full rate is what warmup is there to prevent
        raise TrainingError(f"--warmup-steps must be at least 1; got {config.warmup_steps}.")
    if config.join not in JOINS:
        raise TrainingError(f"--join must be one of {', '.join(JOINS)}; got {config.join!r}.")
    for name in ("new_rows_lr_scale", "new_rows_weight_decay"):
        value = getattr(config, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise TrainingError(f"--{name.replace('_', '-')} must be a finite number >= 0; got {value}.")


def total_updates(config: TrainConfig, order: BatchOrder) -> tuple[int, str]:
    """(optimizer updates of the run, the setting that decided them): ``max_steps``, else ``max_tokens`` // the
    tokens of one update, else ``epochs`` passes over the packed data. Past one pass the batch order reshuffles
    and goes on, so any number of updates is possible whatever the data's size."""
    if config.max_steps is not None:
        return config.max_steps, "max_steps"
    per_step = order.global_batch * config.seq_len
    if config.max_tokens is not None:
        if config.max_tokens < per_step:
            raise TrainingError(
                f"--max-tokens {config.max_tokens:,} is less than one update's {per_step:,} tokens (global batch "
                f"{order.global_batch} x --seq-len {config.seq_len}); give at least {per_step:,}."
            )
        return config.max_tokens // per_step, "max_tokens"
    return max(1, math.ceil(config.epochs * order.steps_per_epoch)), "epochs"


def new_row_group(config: TrainConfig, objective: LMObjective, prepared, sharded: bool) -> new_rows.NewRows | None:
    """The new rows' own group, when their settings differ from the run's and the model's plan has new rows."""
    decay = config.weight_decay if config.new_rows_weight_decay is None else config.new_rows_weight_decay
    if config.new_rows_lr_scale == 1.0 and decay == config.weight_decay:
        return None  # the same settings as every other row: nothing to do
    if prepared is not None:  # VocADT computes its rows from adapters: there are no new rows to train
        raise TrainingError("--new-rows-lr-scale and --new-rows-weight-decay do not apply to VocADT's adapters.")
    if sharded:
        raise TrainingError(
            "--new-rows-lr-scale / --new-rows-weight-decay need whole weights in every process; they cannot run "
            "under FSDP/DeepSpeed ZeRO (use one GPU or DDP)."
        )
    rows = objective.model.get_input_embeddings().weight.shape[0]
    return new_rows.NewRows(new_rows.new_row_ids(config.model, rows), config.new_rows_lr_scale, decay)


def resume_settings(config: TrainConfig) -> dict:
    return {k: getattr(config, k) for k in RESUME_KEYS}


def _load_state(checkpoint: Path, saved: dict, config: TrainConfig) -> RunState:
    """The run's state from a checkpoint's verified ``trainer_state.json`` (``saved``), if its settings match."""
    before = {k: saved["config"].get(k, RESUME_DEFAULTS.get(k)) for k in RESUME_KEYS}
    changed = [k for k in RESUME_KEYS if before[k] != getattr(config, k)]
    if changed:
        diffs = ", ".join(f"{k}: {before[k]!r} -> {getattr(config, k)!r}" for k in changed)
        raise TrainingError(
            f"--resume: the checkpoint {checkpoint} was made with other settings ({diffs}); resume with the same "
            "settings, or start over with another --checkpoint-dir."
        )
    try:
        return RunState(**saved["state"])
    except TypeError as exc:  # fields of another vocgraft version
        raise TrainingError(f"--resume: {checkpoint / STATE_FILE} does not hold a run state this vocgraft reads "
                            f"({exc}); start over with another --checkpoint-dir.") from None  # fmt: skip


def _resume_point(accelerator, root: Path) -> ckpt.ResumePoint | None:
    """The checkpoint to resume from (:func:`~vocgraft.train.checkpoints.choose`), chosen by the main process and
    shared with the others (each would read every file again, and all must agree)."""
    if accelerator.is_main_process:
        ckpt.remove_partials(root)
    if accelerator.num_processes == 1:
        return ckpt.choose(root, 1)
    from accelerate.utils import broadcast_object_list

    box: list = [None]
    if accelerator.is_main_process:
        try:
            box = [ckpt.choose(root, accelerator.num_processes)]
        except TrainingError as exc:
            box = [str(exc)]
    broadcast_object_list(box)
    if isinstance(box[0], str):
        raise TrainingError(box[0])
    return box[0]


def finished_summary(config: TrainConfig) -> dict | None:
    """The recorded summary of a run with ``config``'s settings whose model is already complete in ``config.out``
    (killed, at most, while removing its checkpoints), else None."""
    if not ckpt.finished_run(config.checkpoint_root(), config.out, resume_settings(config)):
        return None
    try:
        summary = json.loads((Path(config.out) / "train_log.json").read_text(encoding="utf-8"))["summary"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return summary if isinstance(summary, dict) else None


def _already_finished(accelerator, config: TrainConfig, summary: dict) -> dict:
    """Remove what a run killed after its final save left (unless checkpoints are kept); return its summary."""
    root = config.checkpoint_root()
    marker = ckpt.finished_run(root, config.out, resume_settings(config)) or {}
    keep = config.keep_checkpoints or marker.get("keep_checkpoints")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _finish(root, keep=keep)
    accelerator.wait_for_everyone()
    return {**summary, "main_process": accelerator.is_main_process, "finished_before": str(config.out),
            "removed_checkpoints": None if keep else str(root)}  # fmt: skip


def _finish(root: Path, keep: bool) -> None:
    """The model is in --out: remove the checkpoints and the finished marker, last. Kept checkpoints keep the
    marker too: it says they belong to a finished run, so a later ``--resume`` says so instead of refusing --out."""
    if keep:
        return
    failpoints.hit(FINAL_BEFORE_CLEANUP, root)
    remove_checkpoints(root)


def _state_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s weights and buffers as saved (a tied matrix once)."""
    seen: dict[int, int] = {}
    for tensor in module.state_dict().values():
        seen.setdefault(id(tensor), tensor.numel() * tensor.element_size())
    return sum(seen.values())


def _continue_hint(checkpoint: Path | None) -> str:
    if checkpoint is None:
        return "rerun (no checkpoint was saved yet: the training starts over)"
    return f"rerun with --resume (it continues from {checkpoint})"


def _validation_loss(wrapped, chunks: torch.Tensor, batch_size: int, accelerator) -> float:
    """Mean next-token loss on the held-out sequences (CLM only, whatever the training objective).

    Through the prepared module (under FSDP the only one that gathers whole weights, under mixed precision the one
    that autocasts): each process scores its share (``rank::processes``) with the same number of forward calls
    (collectives run inside them; a process whose share ran out scores a stand-in row at weight 0), and the sums
    are added across processes."""
    procs, rank = accelerator.num_processes, accelerator.process_index
    mine = chunks[rank::procs]
    calls = math.ceil(math.ceil(len(chunks) / procs) / batch_size)
    was_training = wrapped.training
    wrapped.eval()
    total = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    with torch.no_grad():
        for i in range(calls):
            batch = mine[i * batch_size : (i + 1) * batch_size]
            weight = batch.shape[0]
            ids = (batch if weight else chunks[:1]).to(device=accelerator.device, dtype=torch.long)
            _, clm = wrapped(ids, clm_only=True)
            total[0] += float(clm) * weight
            total[1] += weight
    total = accelerator.reduce(total, reduction="sum")
    wrapped.train(was_training)
    return float(total[0] / total[1])


def is_sharded(accelerator) -> bool:
    """Whether each process holds only a shard of the weights (FSDP, DeepSpeed ZeRO)."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def meta_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module``'s structure whose parameters and buffers are meta tensors (no memory): what a gathered
    state dict is loaded into. Shared tensors stay shared (a tied head stays tied)."""
    import copy

    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) not in memo:
            empty = torch.empty_like(tensor, device="meta")
            is_param = isinstance(tensor, torch.nn.Parameter)
            memo[id(tensor)] = torch.nn.Parameter(empty, requires_grad=tensor.requires_grad) if is_param else empty
    return copy.deepcopy(module, memo)


def trained_objective(accelerator, wrapped, skeleton: torch.nn.Module | None) -> torch.nn.Module | None:
    """The trained objective as one whole module, to save.

    Unwrapped as it is where every process holds whole weights; under FSDP/ZeRO (``skeleton``: a
    :func:`meta_copy` of the objective made before ``prepare``) the full state dict is gathered across processes
    (a collective: every process calls this) and loaded into the skeleton on the main process; other processes get
    None."""
    if not is_sharded(accelerator):
        return accelerator.unwrap_model(wrapped)
    if skeleton is None:
        raise TrainingError("a sharded run needs the objective's skeleton to gather its weights into.")
    state = accelerator.get_state_dict(wrapped)  # full tensors, on the main process only
    if not accelerator.is_main_process:
        return None
    model = skeleton.model
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is emb.weight
    skeleton.load_state_dict(state, strict=True, assign=True)
    if tied and head.weight is not emb.weight:  # a gathered copy per name: one matrix again, as trained
        head.weight = emb.weight
    stale = [name for name, tensor in skeleton.state_dict().items() if tensor.is_meta]
    if stale:
        raise TrainingError(f"the gathered state dict left {stale[:3]} empty; cannot save a partial model.")
    return skeleton


def _checkpoint_activations(model) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant: works with frozen inputs,
    LoRA and FSDP); transformers 5 names it activation checkpointing."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def _hold(model, frozen: torch.dtype) -> None:
    """Frozen weights in ``frozen``, trained ones in float32 (the optimizer's master weights)."""
    for param in model.parameters():
        if not param.is_floating_point():
            continue
        want = torch.float32 if param.requires_grad else frozen
        if param.dtype != want and (param.requires_grad or frozen == torch.float32):
            param.data = param.data.to(want)


def _restore_dtypes(model, dtypes: dict[str, torch.dtype], default: torch.dtype) -> None:
    """Every weight back in the dtype it was loaded in (new ones, e.g. merged rows: ``default``) for the save."""
    for name, param in model.named_parameters():
        want = dtypes.get(name, default)
        if param.is_floating_point() and param.dtype != want:
            param.data = param.data.to(want)


def _save_checkpoint(
    accelerator, root: Path, state: RunState, config: TrainConfig, scheduler, need: int | None = None
) -> Path:
    """All processes write their part to a hidden directory; the main one seals it (synced files and a manifest
    written last), renames it into place and only then removes the older checkpoints. A failure (a full disk)
    removes the hidden directory and leaves the previous checkpoint as it was. ``need``: about how many bytes a
    checkpoint takes, for the message of a full disk."""
    final = root / f"step-{state.step:07d}"
    partial = root / f".step-{state.step:07d}.partial"
    previous = max((p for p in root.glob("step-*") if p.is_dir()), default=None)
    hint = _continue_hint(previous)
    try:
        with translate_disk_errors("checkpoint", final, need=need, flag="--checkpoint-dir", then=hint):
            if accelerator.is_main_process:
                ckpt.remove_partials(root)  # one a killed save left (maybe of this very step)
                root.mkdir(parents=True, exist_ok=True)
            accelerator.wait_for_everyone()
            accelerator.save_state(str(partial))  # model, optimizer, every process's RNG states
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                # the phase's own scheduler (not registered with accelerate: two-stage has one per phase)
                torch.save(scheduler.state_dict(), partial / SCHEDULER_FILE)
                payload = {
                    "config": resume_settings(config),
                    "state": asdict(state),
                    PRECISION_KEY: accelerator.mixed_precision,
                }
                (partial / STATE_FILE).write_text(json.dumps(payload) + "\n", encoding="utf-8")
                ckpt.seal(partial, state.step, accelerator.num_processes)
                ckpt.publish(partial, final)
    except BaseException:
        if accelerator.is_main_process:
            ckpt.remove_partials(root)
        raise
    accelerator.wait_for_everyone()
    return final


def train(config: TrainConfig, prepared: PreparedModel | None = None) -> dict:
    """:func:`_train` holding the checkpoint folder's lock: a second run on it (a second ``--resume``) is refused
    at once, naming this one, instead of failing later on its partial files."""
    from vocgraft.locks import hold

    with hold(config.checkpoint_root(), flag="--checkpoint-dir" if config.checkpoint_dir else "--out"):
        return _train(config, prepared)


def _train(config: TrainConfig, prepared: PreparedModel | None = None) -> dict:
    """Run LAPT as configured and save the trained model to ``config.out``; returns the run's summary.

    ``prepared`` replaces loading ``config.model`` (which then only names the source in manifests)."""
    from accelerate.utils import set_seed

    from vocgraft.corpus import read_corpus
    from vocgraft.devices import dtype_name, frozen_dtype
    from vocgraft.models import describe, load_model

    _check_config(config)
    finished = finished_summary(config)
    if finished is not None and not config.resume:
        raise TrainingError(
            f"--out {config.out} already holds this run's finished model (its checkpoints are in "
            f"{config.checkpoint_root()}); pass --resume to finish the run without training again, or choose "
            "another --out."
        )
    if finished is None:
        check_writable(config.out, config.overwrite)  # fail before any work
    wall_start = time.perf_counter()
    accelerator, precision, autocast = _accelerator(config, prepared)
    if finished is not None:
        return _already_finished(accelerator, config, finished)
    weights_dtype = precision.compute  # what trains and computes; saved in precision.storage
    sharded = is_sharded(accelerator)
    if sharded and prepared is not None:
        raise TrainingError("VocADT adapters cannot be trained under FSDP/DeepSpeed ZeRO; use one GPU or DDP.")
    root = config.checkpoint_root()
    if not config.resume and root.exists() and any(root.glob("step-*")):
        raise TrainingError(
            f"{root} holds checkpoints of an earlier run; pass --resume to continue it, or delete the directory."
        )
    resume = _resume_point(accelerator, root) if config.resume else None
    checkpoint = resume.path if resume else None
    state = _load_state(checkpoint, resume.saved, config) if resume else RunState()
    last_checkpoint = checkpoint  # what a rerun after a failure continues from
    set_seed(config.seed)

    lines = read_corpus(config.corpus, sample=config.sample, seed=config.seed, field=config.field)
    train_lines, val_lines = split_validation(lines, config.val_lines)
    frozen = frozen_dtype(weights_dtype, accelerator.mixed_precision, sharded)
    if prepared is None:
        # straight onto this process's device (prepare would move it there anyway); sharded runs shard from the CPU
        place = "cpu" if sharded else accelerator.device
        model, tokenizer = load_model(config.model, precision, place)
        info = describe(model, tokenizer).to_dict()
    else:
        model, tokenizer, info = prepared.model, prepared.tokenizer, {"model": config.model}
    loaded_dtypes = {name: param.dtype for name, param in model.named_parameters()}
    _hold(model, frozen)
    if config.gradient_checkpointing:
        _checkpoint_activations(model)
    separator = separator_ids(tokenizer, config.join)
    chunks = pack_tokens(tokenizer, train_lines, config.seq_len, join=separator)
    val_chunks = pack_tokens(tokenizer, val_lines, config.seq_len, join=separator)
    micro, procs = config.batch_size, accelerator.num_processes
    order = BatchOrder(len(chunks), micro * config.grad_accum * procs, config.seed)
    total_steps, budget = total_updates(config, order)
    plan = phases(config.strategy, total_steps, config.stage1_share)
    warmups = [warmup_for(phase.steps, config.warmup_steps) for phase in plan]
    eval_every = config.eval_every or max(1, total_steps // 10)
    tokens_per_step = order.global_batch * config.seq_len

    objective = LMObjective(model, config.objective, prepared.extra_loss if prepared else None)
    row_group = new_row_group(config, objective, prepared, sharded)
    bar = progress(
        total=total_steps,
        initial=state.step,
        desc=f"lapt {config.strategy}/{config.objective}",
        unit="step",
        disable=not (config.show_progress and accelerator.is_local_main_process),
    )
    phase_start, pending_checkpoint = 0, checkpoint
    last_save = state.train_seconds
    for phase, warmup in zip(plan, warmups):
        phase_end = phase_start + phase.steps
        objective.model = configure(objective.model, phase.setup)
        _hold(objective, frozen)  # what this phase trains: float32
        if phase_end <= state.step:  # finished before the checkpoint: only its structure (LoRA) matters
            phase_start = phase_end
            continue
        skeleton = meta_copy(objective) if sharded else None
        params = [p for p in objective.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        if row_group is not None and len(row_group.ids):  # on the torch optimizer: accelerate's wrapper calls it
            trained_rows = [w for w in embedding_weights(objective.model) if w.requires_grad]
            if objective.mtp_head is not None:
                trained_rows.append(objective.mtp_head.weight)
            new_rows.attach(optimizer, trained_rows, row_group)
        # stepped by us once per global step (accelerate's wrapper would step it once per process)
        scheduler = cosine_with_warmup(optimizer, warmup, max(phase.steps, 1))
        # AdamW keeps two float32 moments per trained weight: what a checkpoint adds to the weights
        checkpoint_bytes = _state_bytes(objective) + 8 * sum(p.numel() for p in params)
        wrapped, optimizer = accelerator.prepare(objective, optimizer)
        if pending_checkpoint is not None:  # the first phase that runs is the one the checkpoint was taken in
            _load_checkpoint(accelerator, pending_checkpoint, scheduler, resume.verified, root)
            pending_checkpoint = None
        if not state.val:
            state.val.append({"step": 0, "loss": _validation_loss(wrapped, val_chunks, micro, accelerator)})
        wrapped.train()
        for step in range(max(state.step, phase_start), phase_end):
            tick = time.perf_counter()
            rows = order.indices(step).view(procs, -1)[accelerator.process_index]
            pieces = chunks[rows].to(device=accelerator.device, dtype=torch.long).split(micro)
            step_loss = torch.zeros((), device=accelerator.device)
            step_clm = torch.zeros((), device=accelerator.device)
            for i, batch in enumerate(pieces):
                last = i == len(pieces) - 1
                with contextlib.nullcontext() if last else accelerator.no_sync(wrapped):
                    loss, clm = wrapped(batch)
                    accelerator.backward(loss / len(pieces))
                step_loss += loss.detach() / len(pieces)
                step_clm += clm / len(pieces)
            accelerator.clip_grad_norm_(params, config.max_grad_norm)
            lr = scheduler.get_last_lr()[0]  # the rate this update takes
            failpoints.hit(STEP)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            # read on the host before the clock stops: on a GPU this is where the step's kernels are waited for
            step_mean, clm_mean = accelerator.reduce(torch.stack([step_loss, step_clm]), reduction="mean").tolist()
            seconds = time.perf_counter() - tick
            state.train_seconds += seconds
            state.step = step + 1
            state.log.append(
                {
                    "step": state.step,
                    "seconds": round(seconds, 4),
                    "phase": phase.setup,
                    "loss": round(step_mean, 5),
                    "clm_loss": round(clm_mean, 5),
                    "lr": lr,
                }
            )
            if state.step % eval_every == 0 or state.step == total_steps:
                val = _validation_loss(wrapped, val_chunks, micro, accelerator)
                state.val.append({"step": state.step, "loss": val})
            bar.update(1)
            bar.set_postfix(
                loss=f"{state.log[-1]['loss']:.3f}",
                tok_s=f"{state.step * tokens_per_step / max(state.train_seconds, 1e-9):.0f}",
            )
            if state.step < total_steps:
                timed = config.save_minutes is not None and state.train_seconds - last_save >= 60 * config.save_minutes
                stop = config.stop_at is not None and time.time() >= config.stop_at
                if procs > 1:  # clocks differ between processes; saving is a collective, so all must agree
                    flags = accelerator.reduce(torch.tensor([timed, stop], device=accelerator.device), "max")
                    timed, stop = bool(flags[0]), bool(flags[1])
                if state.step % config.save_every == 0 or timed or stop:
                    saved = _save_checkpoint(accelerator, root, state, config, scheduler, need=checkpoint_bytes)
                    last_save, last_checkpoint = state.train_seconds, saved
                    if stop:
                        bar.close()
                        raise TrainingStopped(saved, state.step, total_steps)
        last_phase = phase_end >= total_steps
        # after the last phase the whole module is needed to save (gathered under FSDP); before it, the next
        # phase prepares the same module again
        trained = trained_objective(accelerator, wrapped, skeleton) if last_phase else None
        objective = trained if last_phase else accelerator.unwrap_model(wrapped)
        accelerator.free_memory()
        phase_start = phase_end
    bar.close()
    trainable, total_params = trainable_count(objective.model) if objective is not None else (None, None)
    summary = {
        "strategy": config.strategy,
        "objective": config.objective,
        "recipe": config.recipe,
        "steps": total_steps,  # optimizer updates
        "budget": budget,  # what decided them: epochs | max_steps | max_tokens
        "phases": [{**asdict(p), "warmup_steps": w} for p, w in zip(plan, warmups)],
        "warmup_steps": sum(warmups),  # over all phases (each phase warms up on its own)
        "lr": config.lr,
        "seq_len": config.seq_len,
        "global_batch": order.global_batch,
        "processes": procs,
        "main_process": accelerator.is_main_process,
        "train_lines": len(train_lines),
        "train_sequences": len(chunks),
        "epochs": round(total_steps / order.steps_per_epoch, 3),  # passes over the packed data (fractional)
        "tokens_per_step": tokens_per_step,
        "tokens_trained": total_steps * tokens_per_step,
        "join": config.join,
        "separator": tokenizer.convert_ids_to_tokens(separator),  # the tokens after every line
        "new_rows": row_group.summary() if row_group is not None else None,
        "train_seconds": state.train_seconds,
        "tokens_per_second": total_steps * tokens_per_step / max(state.train_seconds, 1e-9),
        "resumed_from_step": int(checkpoint.name.split("-")[1]) if checkpoint else None,
        "trainable_parameters": trainable,
        "total_parameters": total_params,
        "val": state.val,
        "val_loss_start": state.val[0]["loss"],
        "val_loss_end": state.val[-1]["loss"],
        "peak_rss_mib": peak_rss_mib(),
        "dtype": dtype_name(weights_dtype),
        "mixed_precision": accelerator.mixed_precision,
        "precision": {
            **precision.to_dict(),
            "mixed_precision": accelerator.mixed_precision,
            "mixed_precision_why": autocast.why,  # devices.choose_precision, or kept from the run's checkpoints
        },
        "device": str(accelerator.device),
        "gradient_checkpointing": config.gradient_checkpointing,
        "torch_threads": torch.get_num_threads(),
        "source": info,
    }
    if accelerator.is_main_process:
        saved_dtypes = (loaded_dtypes, weights_dtype)
        run_id = uuid.uuid4().hex  # ties --out to this run's finished marker
        hint = _continue_hint(last_checkpoint)
        with translate_disk_errors("the finished marker", root, need=None, flag="--checkpoint-dir", then=hint):
            ckpt.mark_finished(root, config.out, run_id, resume_settings(config), config.keep_checkpoints)
        failpoints.hit(FINAL_BEFORE_SAVE, config.out)
        need = _state_bytes(objective.model)
        try:
            with translate_disk_errors("the trained model to", config.out, need=need, flag="--out", then=hint):
                _save_trained(objective, tokenizer, config, state, summary, prepared, saved_dtypes, run_id)
        except BaseException:  # the model did not reach --out: the run is not finished
            ckpt.unmark_finished(root)
            raise
        failpoints.hit(FINAL_AFTER_RENAME, config.out)
        _finish(root, keep=config.keep_checkpoints)
    accelerator.wait_for_everyone()
    summary["wall_seconds"] = time.perf_counter() - wall_start
    return summary


def _load_checkpoint(accelerator, checkpoint: Path, scheduler, verified: bool, root: Path) -> None:
    """Load model, optimizer, RNG states and scheduler. A verified checkpoint's files are as written, so a failure
    there is a bug; an older vocgraft's (unverified) may be damaged: that is said in one line."""
    try:
        accelerator.load_state(str(checkpoint))
        scheduler.load_state_dict(torch.load(checkpoint / SCHEDULER_FILE, weights_only=True))
    except Exception as exc:
        if verified:
            raise
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise TrainingError(
            f"--resume: checkpoint {checkpoint} (from an older vocgraft, not verifiable) could not be read ({reason}); "
            f"delete it to resume from an earlier one, or delete {root} to start over."
        ) from exc


def _accelerator(config: TrainConfig, prepared: PreparedModel | None):
    """(Accelerator, the weights' :class:`~vocgraft.devices.DtypeChoice`, the autocast's
    :class:`~vocgraft.devices.PrecisionChoice`): the device (``config.device``), the weights' dtype
    (``config.dtype``: auto stores as the checkpoint does and computes in what the device runs well,
    :func:`vocgraft.devices.choose_dtype`) and the mixed precision that suits them
    (:func:`vocgraft.devices.choose_precision`; a resumed run keeps its checkpoints'), all checked before anything
    is loaded."""
    from accelerate import Accelerator

    from vocgraft.checkpoint import stored_dtype
    from vocgraft.devices import choose_dtype, resolve_device
    from vocgraft.models import dtype_choice_of, resolve

    launched = "LOCAL_RANK" in os.environ  # accelerate launch / torchrun: the launcher assigns each process its GPU
    if launched and config.device != "auto":
        raise TrainingError(f"--device {config.device}: under a multi-process launch each process gets its device "
                            "from the launcher; leave --device auto.")  # fmt: skip
    device = resolve_device(config.device)
    if device.type == "cuda" and not launched:
        torch.cuda.set_device(device)  # accelerate's single-process device is the current one
    if prepared is not None:
        choice = dtype_choice_of(prepared.model)  # made by the caller's load for this device
    else:
        where = resolve(config.model)
        choice = choose_dtype(config.dtype, stored_dtype(where) if Path(where).is_dir() else None, device)
    recorded = _recorded_precision(config.checkpoint_root()) if config.resume else None
    autocast = _autocast(config.mixed_precision, choice.compute, device, recorded, config.checkpoint_root())
    mixed = autocast.mixed
    if config.mixed_precision == "auto" and recorded is None and os.environ.get("ACCELERATE_MIXED_PRECISION"):
        mixed = None  # the launcher's setting (accelerate launch --mixed_precision / its config) wins over auto
        autocast = replace(autocast, why="the launcher's (accelerate launch --mixed_precision or its config)")
    if not launched:
        # accelerate keeps one device and precision per process; a second run in the same process (a sweep, a
        # pipeline, tests) may need others. A launched process trains once and keeps its process group.
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    # on a machine without GPUs, processes of a multi-process launch talk over gloo: accelerate only picks that
    # when told the run is a CPU run
    return Accelerator(cpu=device.type == "cpu", mixed_precision=mixed), choice, autocast


def _recorded_precision(root: Path) -> str | None:
    """The mixed precision the run's checkpoints in ``root`` trained under: :data:`PRECISION_KEY` of the newest
    readable ``trainer_state.json`` (every checkpoint of a run has the same), :data:`UNRECORDED` for checkpoints
    of a vocgraft that did not record it, None where there is none to read (the run starts afresh)."""
    for path in sorted(root.glob("step-*"), reverse=True):  # step-0000012: the names sort as the steps do
        try:
            saved = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # a damaged one: choosing the checkpoint to resume from reports it
        if isinstance(saved, dict) and isinstance(saved.get("config"), dict):
            recorded = saved.get(PRECISION_KEY, UNRECORDED)
            return recorded if isinstance(recorded, str) else UNRECORDED
    return None


def _autocast(requested: str, weights: torch.dtype, device: torch.device, recorded: str | None, root: Path):
    """The run's :class:`~vocgraft.devices.PrecisionChoice` for ``--mixed-precision requested``. Resumed with
    ``auto``, a run keeps what its checkpoints trained under (``recorded``); checkpoints that predate the record
    trained under what auto chose then: no autocast for float32 weights on a CPU. An explicit choice is checked
    against the checkpoints' settings like any other (RESUME_KEYS), so it is the run's own."""
    from vocgraft.devices import DeviceError, PrecisionChoice, choose_precision

    if requested != "auto" or recorded is None:
        return choose_precision(weights, device, requested)
    if recorded == UNRECORDED:
        before = choose_precision(weights, device, "auto", cpu_autocast=False)
        return PrecisionChoice(before.mixed, f"{before.mixed}: what auto chose when the run's checkpoints were made")
    try:
        kept = choose_precision(weights, device, recorded)
    except DeviceError as exc:
        raise TrainingError(
            f"--resume: the run's checkpoints in {root} trained under mixed precision {recorded}, which cannot run "
            f"here ({exc}); resume where the run began, or start over with another --checkpoint-dir."
        ) from None
    return PrecisionChoice(kept.mixed, f"{kept.mixed}: the run's checkpoints trained so")


def _save_trained(
    objective: LMObjective,
    tokenizer,
    config: TrainConfig,
    state: RunState,
    summary: dict,
    prepared: PreparedModel | None,
    saved_dtypes: tuple[dict[str, torch.dtype], torch.dtype],
    run_id: str,
) -> None:
    """The plain causal LM (LoRA merged, MTP head dropped, every weight back in the dtype it was loaded in) with its
    log and loss curve, written atomically."""
    from vocgraft.report import loss_curve_png
    from vocgraft.surgery import save_model_dir

    model = base_model(objective.model)
    if prepared is not None and prepared.finalize is not None:
        model = prepared.finalize(model)
    _restore_dtypes(model, *saved_dtypes)
    model.eval()
    manifest = {
        "inputs": {"model": config.model, "corpus": config.corpus, **config.inputs},
        "training": {k: v for k, v in asdict(config).items() if k not in ("inputs", "out")},
        "metrics": {k: v for k, v in summary.items() if k not in ("val", "source")},
        **(prepared.manifest if prepared else {}),
        "run_id": run_id,  # the finished marker's (vocgraft.train.checkpoints.finished_run)
    }
    log = {"summary": summary, "steps": state.log}
    extra_json = {"train_log.json": log, **(prepared.extra_json if prepared else {})}
    plan_file = Path(config.model) / "vocgraft-plan.json"
    if plan_file.is_file() and "vocgraft-plan.json" not in extra_json:  # same vocabulary: the plan still holds
        extra_json["vocgraft-plan.json"] = json.loads(plan_file.read_text(encoding="utf-8"))
    save_model_dir(
        model,
        tokenizer,
        config.out,
        overwrite=config.overwrite,
        manifest=manifest,
        extra_json=extra_json,
        extra_files={"loss_curve.png": loss_curve_png(state.log, state.val, f"{config.strategy} / {config.objective}")},
    )
