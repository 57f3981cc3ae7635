"""Training objectives: causal LM (``clm``) and multi-token prediction (``mtp``).

``mtp`` adds one extra head that predicts the token two positions ahead from the same final hidden state,
initialised from the LM head's weights; the loss is CLM + the extra head's loss (paper 003). The head lives only in
this wrapper, so the saved model stays a plain causal LM.

The model and the head are one module so that ``accelerate`` wraps (and, across processes, synchronizes) both.
Under bf16 autocast both heads compute their logits in bfloat16; the losses are float32 (:func:`next_token_loss`).
"""

from __future__ import annotations

import torch

OBJECTIVES = ("clm", "mtp")


# logits a loss chunk converts to float32 at once (8 MB): on a CPU the chunk stays in cache, where a float32 copy of
# every logit (tokens x vocabulary) and of its gradient would stream GBs through memory each step
CHUNK_ELEMENTS = 1 << 21


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[:, i]`` predicting ``targets[:, i]``, in float32 (F.cross_entropy of
    ``logits.float()``). ``logits`` [batch, positions, vocabulary] may be a view and may run past ``targets``: the
    positions past its end are not scored (pass a model's whole logits with ``targets = ids[:, 1:]``; no copy)."""
    if logits.dim() != 3 or targets.dim() != 2 or logits.shape[1] < targets.shape[1]:
        raise ValueError(f"logits {list(logits.shape)} do not cover targets {list(targets.shape)}")
    return _ChunkedCrossEntropy.apply(logits, targets)


def _chunks(batch: int, positions: int, vocabulary: int):
    """(row, first, end) position ranges of about CHUNK_ELEMENTS logits each."""
    step = max(1, CHUNK_ELEMENTS // max(vocabulary, 1))
    return [(b, s, min(s + step, positions)) for b in range(batch) for s in range(0, positions, step)]


class _ChunkedCrossEntropy(torch.autograd.Function):
    """The float32 cross-entropy of (bf16, fp16 or float32) logits a chunk of positions at a time, with the gradient
    written in the logits' dtype: the values of ``F.cross_entropy(logits.float(), ...)``, without its float32 copies
    of all logits, their log-probabilities and gradient. Under bf16 autocast those copies cost more than the head's
    matmuls (a CLM head and an MTP head, each tokens x vocabulary)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        batch, positions = targets.shape
        logsumexp = torch.empty(batch, positions, dtype=torch.float32, device=logits.device)
        for b, s, e in _chunks(batch, positions, logits.shape[-1]):
            logsumexp[b, s:e] = torch.logsumexp(logits[b, s:e].float(), dim=-1)
        picked = logits[:, :positions].gather(2, targets.unsqueeze(2)).squeeze(2).float()
        ctx.save_for_backward(logits, targets, logsumexp)
        return (logsumexp - picked).mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets, logsumexp = ctx.saved_tensors
        batch, positions = targets.shape
        scale = grad.float() / targets.numel()
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        out[:, positions:] = 0  # positions that predict nothing here
        for b, s, e in _chunks(batch, positions, logits.shape[-1]):
            probs = torch.exp(logits[b, s:e].float() - logsumexp[b, s:e, None])  # softmax
            probs.scatter_add_(1, targets[b, s:e, None], torch.full((e - s, 1), -1.0, device=probs.device))
            out[b, s:e] = probs.mul_(scale)
        return out, None


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
        clm = next_token_loss(out.logits, input_ids[:, 1:])  # the last position predicts nothing here
        loss = clm
        if clm_only:
            return loss, clm.detach()
        if mtp:
            hidden = out.hidden_states[-1]  # after the final norm: what the LM head reads
            loss = loss + next_token_loss(self.mtp_head(hidden[:, :-2]), input_ids[:, 2:])
        if self.extra_loss is not None:
            loss = loss + self.extra_loss()
        return loss, clm.detach()
