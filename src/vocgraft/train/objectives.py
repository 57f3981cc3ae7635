"""Training objectives: causal LM (``clm``) and multi-token prediction (``mtp``).

``mtp`` adds one extra head that predicts the token two positions ahead from the same final hidden state,
initialised from the LM head's weights; the loss is CLM + the extra head's loss (paper 003). The head lives only in
this wrapper, so the saved model stays a plain causal LM.

The model and the head are one module so that ``accelerate`` wraps (and, across processes, synchronizes) both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

OBJECTIVES = ("clm", "mtp")


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[:, i]`` predicting ``targets[:, i]`` (both already aligned), in float32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


class LMObjective(torch.nn.Module):
    """``forward(input_ids) -> (loss, clm_loss)`` on packed sequences (no padding); ``loss`` includes the MTP
    head's loss and ``extra_loss()`` when there are such."""

    def __init__(self, model, objective: str = "clm", extra_loss=None):
        super().__init__()
        self.model = model
        self.objective = objective
        # a regularizer added to the loss (VocADT's aux loss): computed inside forward, so that under
        # accelerate its gradients are synchronized with the LM loss's
        self.extra_loss = extra_loss
        self.mtp_head = None
        if objective == "mtp":
            head = model.get_output_embeddings()
            self.mtp_head = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=False)
            with torch.no_grad():
                self.mtp_head.weight.copy_(head.weight)
        elif objective != "clm":
            raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}.")

    def forward(self, input_ids: torch.Tensor, clm_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``clm_only``: skip the MTP head and the extra loss (validation scores CLM alone; the head costs about a
        fifth of a forward pass at SmolLM2's size)."""
        mtp = self.mtp_head is not None and not clm_only
        out = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_hidden_states=mtp)
        clm = next_token_loss(out.logits[:, :-1], input_ids[:, 1:])
        loss = clm
        if clm_only:
            return loss, clm.detach()
        if mtp:
            hidden = out.hidden_states[-1]  # after the final norm: what the LM head reads
            loss = loss + next_token_loss(self.mtp_head(hidden[:, :-2]), input_ids[:, 2:])
        if self.extra_loss is not None:
            loss = loss + self.extra_loss()
        return loss, clm.detach()
