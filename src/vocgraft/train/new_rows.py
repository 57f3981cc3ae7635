"""The new vocabulary rows as a group of their own: their own learning rate (a multiple of the run's) and weight
decay.

Which rows are new comes from the model's ``vocgraft-plan.json`` (``VocabPlan.new_ids``: for an expansion the ids
past the source vocabulary, for a replacement the ids not copied from the source). They are rows of the input
embedding, of an untied head, and of the MTP head (initialised from the LM head, so its new rows are new too).

Rows are slices of one Parameter, so they cannot form an optimizer parameter group, and scaling their gradient
would change nothing (Adam's step is invariant to the gradient's scale). AdamW's state (the moments) does not
depend on the learning rate either, so the step of a row at ``scale x lr`` with decay ``wd'`` is exactly the
standard step's, rescaled: with ``p`` the row before the step and ``q`` after it (at ``lr``, decay ``wd``),

    q = p - lr*wd*p - lr*u   ->   p + scale*(q - p) + lr*scale*(wd - wd')*p = p - lr*scale*wd'*p - lr*scale*u

Hooks on the optimizer's step do this: before it they copy the new rows, after it they rescale their change. The
optimizer's state is the standard one, so checkpoints and resume need nothing more, and a step the mixed-precision
scaler skips (inf gradients) runs neither hook.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from vocgraft.train.data import TrainingError

PLAN_FILE = "vocgraft-plan.json"


@dataclass(frozen=True)
class NewRows:
    ids: torch.Tensor  # the new rows' ids, ascending
    scale: float  # their learning rate = scale x the run's (schedule included)
    weight_decay: float

    def summary(self) -> dict:
        return {"rows": len(self.ids), "lr_scale": self.scale, "weight_decay": self.weight_decay}


def new_row_ids(model_dir: str | Path, rows: int) -> torch.Tensor:
    """The ids the plan in ``model_dir`` marks as new, below ``rows`` (padding rows past the vocabulary are not
    tokens); empty when the model has no plan (a source model: nothing is new)."""
    from vocgraft.plan import VocabPlan

    path = Path(model_dir) / PLAN_FILE
    if not path.is_file():
        return torch.empty(0, dtype=torch.long)
    try:
        plan = VocabPlan.from_json(path)
    except (ValueError, json.JSONDecodeError) as exc:
        raise TrainingError(f"--new-rows-lr-scale needs the model's plan, which cannot be read: {exc}") from None
    copied = plan.copied
    return torch.tensor([i for i in range(min(rows, len(plan.target_tokens))) if i not in copied], dtype=torch.long)


def attach(optimizer: torch.optim.Optimizer, weights: list[torch.nn.Parameter], group: NewRows) -> list:
    """Hooks that give ``group.ids``'s rows of ``weights`` (each a [vocabulary, hidden] matrix the optimizer
    trains; a tied matrix once) their own rate and decay. Returns the hook handles."""
    unique = list({id(w): w for w in weights}.values())
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    missing = [w for w in unique if id(w) not in group_of]
    if missing:
        raise TrainingError("the new-row group names a weight the optimizer does not train.")
    ids = {id(w): group.ids.to(w.device) for w in unique}
    before: dict[int, torch.Tensor] = {}

    def save_rows(_optimizer, _args, _kwargs) -> None:
        before.clear()
        for w in unique:
            if w.grad is not None:  # AdamW leaves a weight without a gradient as it is
                before[id(w)] = w.detach()[ids[id(w)]].clone()

    @torch.no_grad()
    def rescale_rows(_optimizer, _args, _kwargs) -> None:
        for w in unique:
            old = before.pop(id(w), None)
            if old is None:
                continue
            settings = group_of[id(w)]
            lr, decay = float(settings["lr"]), float(settings["weight_decay"])
            row_ids = ids[id(w)]
            new = old + group.scale * (w[row_ids] - old) + (lr * group.scale * (decay - group.weight_decay)) * old
            w.index_copy_(0, row_ids, new)

    return [optimizer.register_step_pre_hook(save_rows), optimizer.register_step_post_hook(rescale_rows)]
