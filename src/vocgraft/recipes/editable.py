"""The model a recipe edits, behind one interface whichever way it was opened: loaded whole (transformers), or a
:class:`~vocgraft.shards.ShardedModel` edited on its safetensors files. The recipe asks it for the new tokens'
rows, grafts them, and saves the directory, without asking which kind it holds (:func:`editable` decides once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vocgraft.init import InitContext, initialize, initialize_matrices
from vocgraft.plan import VocabPlan
from vocgraft.shards import ShardedModel
from vocgraft.surgery import SurgeryError, graft, save_model_dir, untie_head


class LoadedModel:
    """A model loaded whole: rows from its weights (a method may run it), grafted and saved in memory."""

    def __init__(self, model: Any):
        self.model = model

    def untie_head(self, method: str) -> None:
        untie_head(self.model)

    def new_rows(self, chosen, ctx: InitContext):
        return initialize(self.model, chosen, ctx)

    def graft(self, plan: VocabPlan, input_rows, head_rows, tokenizer) -> None:
        graft(self.model, plan, input_rows, head_rows, tokenizer)

    def save(self, tokenizer, out_dir: str | Path, **how) -> Path:
        return save_model_dir(self.model, tokenizer, out_dir, **how)


class ShardedFiles:
    """A :class:`~vocgraft.shards.ShardedModel`: rows from its matrices read one at a time; the graft is recorded
    and written into the new files when it saves."""

    def __init__(self, model: ShardedModel):
        self.model = model

    def untie_head(self, method: str) -> None:
        # the shard path rewrites the matrices the source has: it has no new head to write
        raise SurgeryError(f"init method {method!r} unties the head, which needs the model loaded: --surgery full.")

    def new_rows(self, chosen, ctx: InitContext):
        head = None if self.model.tied else self.model.matrix_reader("head")
        return initialize_matrices(chosen, ctx, self.model.matrix_reader("input"), head)

    def graft(self, plan: VocabPlan, input_rows, head_rows, tokenizer) -> None:
        self.model.graft(plan, input_rows, head_rows, tokenizer)

    def save(self, tokenizer, out_dir: str | Path, **how) -> Path:
        return save_model_dir(self.model.skeleton, tokenizer, out_dir, write_weights=self.model.weight_writer(), **how)


def editable(model: Any) -> LoadedModel | ShardedFiles:
    """``model`` (loaded, or a ShardedModel) behind the one interface."""
    return ShardedFiles(model) if isinstance(model, ShardedModel) else LoadedModel(model)
