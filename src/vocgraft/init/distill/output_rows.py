"""Output rows for new tokens, fitted by next-token cross-entropy on text as the expanded tokenizer spells it.

Why not calibrate each new row to the source's probability of its pieces (vocgraft's first form)? With the old
logits fixed, a token given that probability q leaves its first piece p1 (1 - q), which beats q unless the rest of
the pieces follow with probability above 1 / (1 + p1): greedy decoding kept spelling words with old pieces and never
emitted a new token (0 of ~80 canonical new-token positions on the source's own greedy text, Greek k=100 and k=1000,
shared/reviews/distill-lapt-end-to-end.md). In the expanded model the first piece followed by the token's other
pieces is never how the tokenizer spells text, so the data say how much of the first piece's mass belongs to the
token: fit the rows to the canonical next token itself. The body is frozen and reads the student's input rows, so the
old logits at every position are fixed: their log-sum-exp and the target's old logit are computed once, and each
evaluation of the loss costs positions x new tokens x hidden. The loss is convex in the rows (log-sum-exp of
linear functions minus a linear term): L-BFGS over all rows at once, with a ridge pull towards an anchor row
(the first piece's row: the new token starts level with its first piece and learns where it should win).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vocgraft.init.distill.input_rows import Student, _decoder, _pad
from vocgraft.init.distill.snippets import Snippet
from vocgraft.progress import progress

POSITION_CHUNK = 8192  # positions per block of the loss (block x new tokens floats)


@dataclass
class CanonicalText:
    """Positions of canonically spelled text: what the frozen model's final hidden state there predicts next.

    ``target`` is an index into the new rows, or -1 where the next token is an old one (its logit is fixed:
    ``old_target_logit``); ``old_lse`` is the log-sum-exp of every old logit at the position."""

    hidden: torch.Tensor  # [positions, hidden] float32
    target: torch.Tensor  # [positions] long
    old_target_logit: torch.Tensor  # [positions] float32 (0 where the target is new)
    old_lse: torch.Tensor  # [positions] float32
    bias: float = 0.0  # the head's mean bias (models with a biased head), added to every new logit
    cap: float | None = None  # final-logit soft-capping (Gemma 2/3): logits = cap * tanh(logits / cap)

    def new_logits(self, rows: torch.Tensor, sl: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(new logits, d logit / d raw) for positions ``sl``; the slope is None where it is 1 (no soft-capping)."""
        raw = self.hidden[sl] @ rows.T
        if self.bias:
            raw += self.bias
        if not self.cap:
            return raw, None
        squashed = torch.tanh(raw / self.cap)
        return self.cap * squashed, 1 - squashed.square()


def canonical_windows(snippets: list[Snippet], max_positions: int) -> list[np.ndarray]:
    """The distinct canonical windows of the snippets (the paper's form makes one snippet per occurrence, so a
    window around several occurrences comes back several times), up to ``max_positions`` predicting positions."""
    seen, windows, positions = set(), [], 0
    for snippet in snippets:
        window = snippet.canonical
        if window is None or len(window) < 3:  # prefix + at least two tokens: one position predicts
            continue
        key = window.tobytes()
        if key in seen:
            continue
        seen.add(key)
        windows.append(window)
        positions += len(window) - 2
        if positions >= max_positions:
            break
    return windows


def student_states(model, windows: list[np.ndarray], rows: torch.Tensor, *, batch: int, show_progress: bool):
    """(hidden, next ids) at every position of each window but the prefix: the frozen model reading the new rows
    ``rows`` where a window has a new token. Ids follow the snippets' convention (source id >= 0, new ``-(1 + j)``).
    The prefix's own prediction is left out: a window starts mid-line, so what follows the prefix there is not what
    follows a BOS."""
    student = Student(model)
    decoder = _decoder(model)
    order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
    groups = [order[i : i + batch] for i in range(0, len(order), batch)]
    hidden_parts, next_parts = [], []
    bar = progress(groups, desc="distill head states", unit="batch", disable=not show_progress or len(groups) < 2)
    with torch.no_grad():
        for group in bar:
            ids, mask = _pad([windows[i] for i in group], 0, student.device)
            hidden = decoder(inputs_embeds=student.inputs(ids, rows), attention_mask=mask).last_hidden_state
            for row, i in enumerate(group):
                n = len(windows[i])
                hidden_parts.append(hidden[row, 1 : n - 1].float().cpu())
                next_parts.append(torch.from_numpy(windows[i][2:n]))
    width = model.get_input_embeddings().weight.shape[1]
    if not hidden_parts:
        return torch.zeros(0, width), torch.zeros(0, dtype=torch.long)
    return torch.cat(hidden_parts), torch.cat(next_parts)


def canonical_text(model, old_head: torch.Tensor, hidden: torch.Tensor, next_ids: torch.Tensor) -> CanonicalText:
    """The fixed part of the loss: per position, the log-sum-exp of the old logits (``old_head``: every old output
    row, as the expanded model keeps them) and the old target's logit."""
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    head = model.get_output_embeddings()
    bias_vector = getattr(head, "bias", None) if head is not None else None
    n_old = old_head.shape[0]
    lse = torch.empty(len(hidden))
    target_logit = torch.zeros(len(hidden))
    old_target = next_ids >= 0
    for lo in range(0, len(hidden), POSITION_CHUNK):
        sl = slice(lo, lo + POSITION_CHUNK)
        logits = hidden[sl] @ old_head.T.float()
        if bias_vector is not None:
            logits += bias_vector.detach().float().cpu()[:n_old]
        if cap:
            logits = cap * torch.tanh(logits / cap)
        lse[sl] = torch.logsumexp(logits, dim=1)
        ids = next_ids[sl].clamp(min=0)
        target_logit[sl] = torch.where(old_target[sl], logits.gather(1, ids.unsqueeze(1)).squeeze(1), 0.0)
    bias = float(bias_vector.detach().float()[:n_old].mean()) if bias_vector is not None else 0.0
    target = torch.where(old_target, -1, -next_ids - 1)
    return CanonicalText(hidden, target, target_logit, lse, bias, cap)


def ce_loss_and_grad(
    rows: torch.Tensor, text: CanonicalText, anchor: torch.Tensor | None = None, ridge: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token cross-entropy over the positions of ``text`` with the new rows ``rows`` next to the fixed
    old logits, plus ``ridge`` x |rows - anchor|^2; and its gradient with respect to ``rows``."""
    rows = rows.detach().float()
    grad = torch.zeros_like(rows)
    total = torch.zeros((), dtype=torch.float64)
    n = max(len(text.target), 1)
    for lo in range(0, len(text.target), POSITION_CHUNK):
        sl = slice(lo, lo + POSITION_CHUNK)
        logits, slope = text.new_logits(rows, sl)
        target = text.target[sl]
        is_new = target >= 0
        target_logit = torch.where(
            is_new, logits.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1), text.old_target_logit[sl]
        )
        # one pass of exp over positions x new tokens (the big elementwise cost): shifted by the larger of the
        # new logits' maximum and the old log-sum-exp, then rescaled into probabilities
        old_lse = text.old_lse[sl]
        top = torch.maximum(logits.amax(dim=1), old_lse)
        d_logits = torch.exp(logits - top.unsqueeze(1))
        lse = top + torch.log(d_logits.sum(dim=1) + torch.exp(old_lse - top))
        d_logits *= torch.exp(top - lse).unsqueeze(1)
        total += (lse - target_logit).sum().double()
        hits = is_new.nonzero().squeeze(1)
        d_logits[hits, target[hits]] -= 1
        if slope is not None:
            d_logits *= slope
        grad += d_logits.T @ text.hidden[sl]
    loss = total / n
    grad /= n
    if ridge and anchor is not None:
        diff = rows - anchor
        loss = loss + ridge * diff.square().sum().double()
        grad += 2 * ridge * diff
    return loss.float(), grad


def fit_head_rows(
    text: CanonicalText, anchor: torch.Tensor, ridge: float, iterations: int = 100
) -> tuple[torch.Tensor, dict[str, float]]:
    """New output rows minimizing :func:`ce_loss_and_grad` from ``anchor`` (L-BFGS). ``ridge`` is dimensionless:
    a token seen n times is pulled towards its anchor like n / (n + ridge) observations of a typical context."""
    if len(text.target) == 0:
        return anchor.clone(), {"head_ce_start": 0.0, "head_ce_end": 0.0, "positions": 0}
    h2 = float(text.hidden.square().sum(dim=1).mean())
    lam = ridge * h2 / len(text.target)
    rows = anchor.clone().float().requires_grad_(True)
    start, _ = ce_loss_and_grad(anchor, text)
    optimizer = torch.optim.LBFGS([rows], lr=1, max_iter=iterations, history_size=20, line_search_fn="strong_wolfe")
    evaluations = 0

    def closure():
        nonlocal evaluations
        evaluations += 1
        loss, grad = ce_loss_and_grad(rows, text, anchor, lam)
        rows.grad = grad
        return loss

    optimizer.step(closure)
    end, _ = ce_loss_and_grad(rows.detach(), text)
    return rows.detach(), {
        "head_ce_start": float(start),
        "head_ce_end": float(end),
        "positions": len(text.target),
        "new_target_positions": int((text.target >= 0).sum()),
        "evaluations": evaluations,  # of the loss and its gradient, each about 4 x positions x rows x hidden FLOPs
    }
