"""Surgery: put a new vocabulary's embedding (and LM-head) rows into a model, and save the result.

Matrices in, model out. The init stage decides *what* the new rows are; this module only decides *where* they
go:

- **expand**: every old row is kept verbatim, including padding rows beyond the tokenizer length (Qwen-style
  ``vocab_size > len(tokenizer)``); new ids are written from the given rows. New ids may land on padding rows
  (overwriting them) or past the end (the matrix grows). The matrix never shrinks.
- **replace**: the matrix has one row per target id; copied ids take their source row (``plan.copied``), new
  ids take the given rows.

Tied models stay tied (one matrix); untied heads are built the same way from the old head and ``head_rows``.
New rows are computed in float32 and stored in the model's own dtype; old rows are copied bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vocgraft.errors import UserError
from vocgraft.outdir import atomic_output_dir, check_writable, json_text, write_manifest
from vocgraft.tokenization.ids import id_range
from vocgraft.tokenization.portable import save_portable

if TYPE_CHECKING:
    from vocgraft.plan import VocabPlan

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


class SurgeryError(UserError, ValueError):
    """The plan, the rows and the model do not fit together."""


# ----------------------------------------------------------------------------------------------------------
# graft


def graft(
    model: Any,
    plan: VocabPlan,
    input_rows: torch.Tensor,
    head_rows: torch.Tensor | None,
    target_tokenizer: Any,
) -> Any:
    """Write the plan's vocabulary into ``model`` in place and return it.

    ``input_rows`` (and ``head_rows`` for an untied head) hold one row per ``plan.new_ids`` entry, in that
    order.
    For a tied model ``head_rows`` must be None: the head *is* the input matrix.
    """
    if plan.mode not in ("expand", "replace"):
        raise SurgeryError(f"plan.mode is {plan.mode!r}; expected 'expand' or 'replace'.")
    emb = model.get_input_embeddings()
    if not isinstance(emb, nn.Embedding):
        raise SurgeryError(f"input embeddings are {type(emb).__name__}, not nn.Embedding; cannot graft rows.")
    head = model.get_output_embeddings()
    if head is not None and not isinstance(head, nn.Linear):
        raise SurgeryError(f"LM head is {type(head).__name__}, not an nn.Linear; cannot graft rows.")
    tied = head is not None and head.weight is emb.weight
    # Check every input before touching the model, so a failed graft leaves it as it was.
    new_ids = list(plan.new_ids)
    old_rows, hidden = emb.weight.shape
    _check_rows("input_rows", input_rows, len(new_ids), hidden)
    if tied or head is None:
        if head_rows is not None:
            raise SurgeryError(
                "head_rows were given but the model's LM head is tied to its input embeddings (one matrix); "
                "pass head_rows=None — the input rows are used for both."
            )
    else:
        if head_rows is None:
            raise SurgeryError(
                "the model's LM head is untied: pass head_rows, initialized from the LM head (head space) "
                "with the same method as input_rows."
            )
        if head.weight.shape[0] != old_rows:
            raise SurgeryError(
                f"LM head has {head.weight.shape[0]} rows but the input embeddings have {old_rows}; "
                "cannot graft a model whose matrices disagree."
            )
        _check_rows("head_rows", head_rows, len(new_ids), head.weight.shape[1])
    n_rows = _check_plan(plan, new_ids, old_rows, id_range(target_tokenizer))

    new_weight = _build_matrix(plan, emb.weight, input_rows, new_ids, n_rows)
    # Swap the Parameter inside the existing module rather than installing a fresh nn.Embedding: subclasses
    # such as Gemma's scaled embedding (x sqrt(hidden) in forward) and any attached hooks stay as they were.
    emb.weight = nn.Parameter(new_weight, requires_grad=emb.weight.requires_grad)
    emb.num_embeddings = n_rows
    if plan.mode == "replace":
        _retarget_padding_idx(emb, target_tokenizer.pad_token_id, n_rows)

    if head is not None:
        if tied:
            _replace_bias(head, plan, new_ids, n_rows)
            head.weight = emb.weight
            # Let transformers redo its own tying bookkeeping too (it re-points lm_head at the embedding).
            if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
                model.tie_weights()
            if head.weight is not emb.weight:  # tie_weights must not have untied what we tied
                raise SurgeryError("LM head lost its tie to the input embeddings during surgery.")
        else:
            assert head_rows is not None
            head_weight = _build_matrix(plan, head.weight, head_rows, new_ids, n_rows)
            _replace_bias(head, plan, new_ids, n_rows)
            head.weight = nn.Parameter(head_weight, requires_grad=head.weight.requires_grad)
        head.out_features = n_rows

    _update_config(model, n_rows)
    if plan.mode == "replace":
        _sync_special_ids(model, target_tokenizer, plan)
    return model


def untie_head(model: Any) -> Any:
    """Give a tied LM head its own copy of the embedding matrix (and say so in the config), in place."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is not emb.weight:
        return model
    head.weight = nn.Parameter(emb.weight.detach().clone(), requires_grad=emb.weight.requires_grad)
    for cfg in _configs(model):
        cfg.tie_word_embeddings = False
    return model


def _check_rows(name: str, rows: torch.Tensor, n_new: int, hidden: int) -> None:
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2:
        shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise SurgeryError(f"{name} must be a 2-D tensor (new tokens x hidden), got {shape}.")
    if rows.shape[0] != n_new:
        raise SurgeryError(f"{name} has {rows.shape[0]} rows but the plan has {n_new} new ids (len(plan.new_ids)).")
    if rows.shape[1] != hidden:
        raise SurgeryError(f"{name} has hidden size {rows.shape[1]} but the model's matrix has {hidden}.")
    if not torch.isfinite(rows).all():
        bad = (~torch.isfinite(rows)).any(dim=1).nonzero().flatten()[:5].tolist()
        raise SurgeryError(f"{name} contains NaN or inf (rows {bad} ...); the init method is broken.")


def _check_plan(plan: VocabPlan, new_ids: list[int], old_rows: int, target_len: int) -> int:
    """Validate the plan against the model and return the number of rows of the new matrices."""
    n_source = len(plan.source_tokens)
    if n_source > old_rows:
        raise SurgeryError(
            f"the plan's source vocabulary has {n_source} tokens but the model has only {old_rows} "
            "embedding rows; is this the plan for this model?"
        )
    copied_t = plan.copied_target_ids
    copied_s = plan.copied_source_ids
    if len(copied_s) and int(copied_s.max()) >= old_rows:
        top = int(copied_s.max())
        raise SurgeryError(f"plan copies source id {top}; the model has only {old_rows} rows.")
    max_id = max([-1, *new_ids] + ([int(copied_t.max())] if len(copied_t) else []))

    if plan.mode == "expand":
        if not torch.equal(copied_t, copied_s):
            raise SurgeryError("an expand plan must copy every source token to its own id (target id == source id).")
        if new_ids and min(new_ids) < n_source:
            raise SurgeryError(
                f"expand plan puts new id {min(new_ids)} inside the source vocabulary (< {n_source}); "
                "it would overwrite a source token's row."
            )
        # Never shrink: padding rows past the tokenizer stay, new ids past the end grow the matrix.
        n_rows = max(old_rows, max_id + 1)
    else:
        n_rows = max(target_len, max_id + 1)
        covered = torch.zeros(n_rows, dtype=torch.bool)
        covered[copied_t] = True
        covered[torch.tensor(new_ids, dtype=torch.long)] = True
        if not covered.all():
            missing = (~covered).nonzero().flatten()
            raise SurgeryError(
                f"replace plan leaves {len(missing)} target ids without a row (neither copied nor new), "
                f"e.g. {missing[:5].tolist()}; the target tokenizer has {target_len} tokens."
            )
    if target_len > n_rows:
        raise SurgeryError(f"the target tokenizer has {target_len} tokens but the new matrix would have {n_rows} rows.")
    return n_rows


def _build_matrix(
    plan: VocabPlan, old: torch.Tensor, rows: torch.Tensor, new_ids: list[int], n_rows: int
) -> torch.Tensor:
    """The new (n_rows x hidden) matrix in ``old``'s dtype and device: old rows copied verbatim, new rows computed
    in float32 and cast once, rows that are neither zero.

    Old rows are copied in their stored dtype, not through a float32 copy of the whole matrix: a bfloat16/float16
    value survives a float32 round trip exactly, so the bits are the same, and a 262K-row matrix needs no float32
    twin (1.9 GB -> 3.8 GB more). Works on meta tensors too (shapes only: the shard path's skeleton model)."""
    old = old.detach()
    new = torch.zeros(n_rows, old.shape[1], dtype=old.dtype, device=old.device)
    if plan.mode == "expand":
        new[: old.shape[0]] = old  # all old rows verbatim, padding rows included
    else:
        new[plan.copied_target_ids.to(old.device)] = old[plan.copied_source_ids.to(old.device)]
    if new_ids:
        idx = torch.tensor(new_ids, dtype=torch.long, device=old.device)
        new[idx] = rows.detach().to(device=old.device, dtype=torch.float32).to(old.dtype)
    return new


def _replace_bias(head: nn.Linear, plan: VocabPlan, new_ids: list[int], n_rows: int) -> None:
    """Carry an LM-head bias over like the rows (:func:`_build_bias`)."""
    if head.bias is None:
        return
    new = _build_bias(plan, head.bias, new_ids, n_rows)
    head.bias = nn.Parameter(new, requires_grad=head.bias.requires_grad)


def _build_bias(plan: VocabPlan, old: torch.Tensor, new_ids: list[int], n_rows: int) -> torch.Tensor:
    """The LM-head bias for the new vocabulary; new ids get the mean bias of the source tokens.

    Why the mean and not zero: a bias sets a token's prior; zero next to old biases of, say, -5 would make
    every new token far more (or less) likely than a typical token. The mean is taken over real source tokens
    only, not over padding rows, which may hold anything.
    """
    old32 = old.detach().to(torch.float32)
    mean = old32[: len(plan.source_tokens)].mean() if len(plan.source_tokens) else old32.new_zeros(())
    new = torch.zeros(n_rows, dtype=torch.float32, device=old32.device)
    if plan.mode == "expand":
        new[: old32.shape[0]] = old32
    else:
        new[plan.copied_target_ids.to(old32.device)] = old32[plan.copied_source_ids.to(old32.device)]
    if new_ids:
        new[torch.tensor(new_ids, dtype=torch.long, device=old32.device)] = mean
    return new.to(old.dtype)


def _retarget_padding_idx(emb: nn.Embedding, pad_id: int | None, n_rows: int) -> None:
    # padding_idx only freezes that row's gradient; after replacement it must point at the *target* pad token,
    # which is also what a reload builds from the updated config.pad_token_id.
    if emb.padding_idx is None:
        return
    emb.padding_idx = pad_id if pad_id is not None and 0 <= pad_id < n_rows else None


def _configs(model: Any) -> list[Any]:
    """The model's config, its text config where that is a separate object (multimodal models)."""
    return list({id(c): c for c in (model.config, model.config.get_text_config())}.values())


def _update_config(model: Any, n_rows: int) -> None:
    """config.vocab_size = rows."""
    for cfg in _configs(model):
        cfg.vocab_size = n_rows
    # transformers models cache vocab_size on the module too (used e.g. by the loss).
    for module in model.modules():
        if isinstance(getattr(module, "vocab_size", None), int) and hasattr(module, "config"):
            module.vocab_size = n_rows


def _sync_special_ids(model: Any, tokenizer: Any, plan: VocabPlan | None = None) -> None:
    """Special-token ids of the config and generation_config in the target vocabulary.

    Each source id becomes the target id that copies its row (the same token, e.g. ``<|eot_id|>``), so a list
    stays a list of the same tokens (Llama-3 instruct models stop on three); an id without a copy, or no plan,
    falls back to the target tokenizer's token of that role. Source ids mean nothing in a target vocabulary: a role
    the tokenizer lacks becomes None, not a stale id. generation_config matters most: generate() stops on its
    eos_token_id.
    """
    to_target: dict[int, int] = {}
    if plan is not None:
        for tid, sid in plan.copied.items():
            to_target.setdefault(sid, tid)
    gen = getattr(model, "generation_config", None)
    for cfg in [*_configs(model), *([gen] if gen is not None else [])]:
        for name in SPECIAL_IDS:
            role = getattr(tokenizer, name, None)
            value = getattr(cfg, name, None)
            if isinstance(value, (list, tuple)):
                mapped = [to_target[v] for v in value if v in to_target]
                new = mapped or ([role] if role is not None else None)
            elif value is not None and value in to_target:
                new = to_target[value]
            else:
                new = role
            setattr(cfg, name, new)


# ----------------------------------------------------------------------------------------------------------
# save


def save_model_dir(
    model: Any,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    manifest: dict | None = None,
    extra_json: dict[str, Any] | None = None,
    extra_files: dict[str, bytes] | None = None,
    write_weights: Callable[[Path], None] | None = None,
) -> Path:
    """Save model (safetensors), tokenizer and ``vocgraft.json`` to ``out_dir`` atomically; return the path.

    ``write_weights(dir)``: writes config and weights instead of ``model.save_pretrained`` (the shard path, whose
    ``model`` is a meta-device skeleton: :mod:`vocgraft.shards`).

    ``extra_json``: more files written into the same directory before it is renamed into place, name -> object
    (e.g. the VocabPlan), so the directory is complete or absent; ``extra_files``: the same for raw bytes (a plot).

    Refuses to overwrite an existing ``out_dir`` unless ``overwrite``; a failure leaves no directory behind.
    """
    from vocgraft.models import dtype_choice_of, in_storage_dtype

    out = check_writable(out_dir, overwrite)  # before any work
    rows = model.get_input_embeddings().weight.shape[0]
    needed = id_range(tokenizer)  # every id the tokenizer can produce needs a row, gaps in its ids included
    head = model.get_output_embeddings()
    head_rows = head.weight.shape[0] if head is not None else rows
    if needed > min(rows, head_rows):
        raise SurgeryError(
            f"the tokenizer can produce ids up to {needed - 1} but the model has only {min(rows, head_rows)} "
            "embedding/LM-head rows; graft the tokenizer's vocabulary into the model before saving."
        )
    facts = {
        "model_class": type(model).__name__,
        "vocab_size": rows,
        "tokenizer_length": len(tokenizer),
        "tied": head is not None and head.weight is model.get_input_embeddings().weight,
        "dtype": str(dtype_choice_of(model).storage).removeprefix("torch."),
        "precision": dtype_choice_of(model).to_dict(),  # stored vs computed in, and why
    }
    with atomic_output_dir(out, overwrite=overwrite) as tmp:
        if write_weights is not None:
            write_weights(tmp)
        else:
            with in_storage_dtype(model):  # a model computed in float32 is saved in its checkpoint's dtype
                model.save_pretrained(tmp)  # transformers >= 5 always writes safetensors
        save_portable(tokenizer, tmp)
        for name, data in (extra_json or {}).items():
            (tmp / name).write_text(json_text(data), encoding="utf-8")
        for name, blob in (extra_files or {}).items():
            (tmp / name).write_bytes(blob)
        write_manifest(tmp, "model", **{**facts, **(manifest or {})})
    return out


# ----------------------------------------------------------------------------------------------------------
# baseline


def mean_resizing_baseline(model: Any, target_tokenizer: Any) -> Any:
    """What most users get today: ``resize_token_embeddings(len(target_tokenizer), mean_resizing=True)``.

    Rows are kept *by position* (row i stays row i whatever token it now stands for) and rows past the old end
    are sampled around the old mean. The matrix shrinks if the tokenizer is shorter (padding rows are cut).
    Only the special-token ids are synced with the target tokenizer, so generation stops at the target EOS
    and the comparison measures the rows, not a stale config.
    """
    model.resize_token_embeddings(len(target_tokenizer), mean_resizing=True)
    _sync_special_ids(model, target_tokenizer)
    return model
