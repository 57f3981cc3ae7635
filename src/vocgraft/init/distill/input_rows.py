"""Distilled input rows (Token Distillation, Dobler, Elliott & de Melo 2025, arXiv 2505.20133): the frozen model fed a
snippet with the new token (the student) should produce the final hidden states it produces for the snippet as the
source spells it (the teacher), at the new token and every position after it. Only the new rows are trained."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from vocgraft.init.distill.snippets import Snippet
from vocgraft.progress import progress

# a head objective for a tied row: rows -> (loss, gradient with respect to rows)
HeadObjective = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Student:
    """Student input embeddings: frozen source rows gathered by id, new rows from a trainable matrix."""

    def __init__(self, model) -> None:
        self.model = model
        self.embed = model.get_input_embeddings()
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.scale = _embedding_scale(self.embed)

    def inputs(self, student: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Input embeddings for a padded batch of student sequences (see ``Snippet.student``)."""
        is_new = student < 0
        with torch.no_grad():
            base = self.embed(student.clamp(min=0))
        new = (rows[(-student - 1).clamp(min=0)] * self.scale).to(self.dtype)
        return torch.where(is_new.unsqueeze(-1), new, base)


def _embedding_scale(embed) -> float:
    """What the embedding module multiplies its stored rows by (Gemma-3-style scaled embeddings: sqrt(hidden)):
    new rows are stored unscaled and must be scaled like the old ones when fed as ``inputs_embeds``."""
    weight = embed.weight
    norms = weight.detach().float().norm(dim=1)
    probe = int(torch.argmax(norms[: min(len(norms), 4096)]))
    with torch.no_grad():
        out = embed(torch.tensor([probe], device=weight.device)).float()[0]
    row = weight[probe].detach().float()
    return float(out @ row / (row @ row)) if float(row @ row) > 0 else 1.0


def _decoder(model):
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise ValueError(f"distill needs a causal LM with a base model (got {type(model).__name__}).")
    return base


def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The model's next-token logits from final hidden states (its head, then final-logit soft-capping)."""
    logits = model.get_output_embeddings()(hidden.to(model.get_output_embeddings().weight.dtype)).float()
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return cap * torch.tanh(logits / cap) if cap else logits


def _pad(seqs: list[np.ndarray], value: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.from_numpy(seq)
        mask[row, : len(seq)] = 1
    return out.to(device), mask.to(device)


def _batches(snippets: list[Snippet], size: int, side: str = "student") -> list[list[int]]:
    """Snippet indices grouped by the length of one side's sequence (little padding)."""
    order = sorted(range(len(snippets)), key=lambda i: len(getattr(snippets[i], side)))
    return [order[i : i + size] for i in range(0, len(order), size)]


def teacher_targets(model, snippets: list[Snippet], *, batch: int, show_progress: bool) -> list[torch.Tensor]:
    """The frozen model over every snippet as the source spells it, once: per snippet, the final hidden states the
    student must reproduce (at ``loss_teacher``)."""
    decoder = _decoder(model)
    device = next(model.parameters()).device
    targets: list[torch.Tensor | None] = [None] * len(snippets)
    groups = _batches(snippets, batch, "teacher")
    bar = progress(groups, desc="distill teacher", unit="batch", disable=not show_progress or len(groups) < 2)
    with torch.no_grad():
        for group in bar:
            ids, mask = _pad([snippets[i].teacher for i in group], 0, device)
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
            for row, i in enumerate(group):
                targets[i] = hidden[row, torch.from_numpy(snippets[i].loss_teacher).to(device)].float()
    return targets


class RowAdam:
    """Adam over the rows of one matrix where a row moves only on steps its gradient is non-zero (its token was
    in the batch); bias correction counts each row's own steps."""

    def __init__(self, rows: torch.Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        self.rows, self.lr, self.betas, self.eps = rows, lr, betas, eps
        self.m = torch.zeros_like(rows)
        self.v = torch.zeros_like(rows)
        self.t = torch.zeros(rows.shape[0], dtype=torch.float32, device=rows.device)

    @torch.no_grad()
    def step(self, grad: torch.Tensor, active: torch.Tensor) -> None:
        idx = active.nonzero().flatten()
        if len(idx) == 0:
            return
        b1, b2 = self.betas
        g = grad[idx]
        self.m[idx] = b1 * self.m[idx] + (1 - b1) * g
        self.v[idx] = b2 * self.v[idx] + (1 - b2) * g.square()
        self.t[idx] += 1
        t = self.t[idx].unsqueeze(1)
        m_hat = self.m[idx] / (1 - b1**t)
        v_hat = self.v[idx] / (1 - b2**t)
        self.rows[idx] -= self.lr * m_hat / (v_hat.sqrt() + self.eps)


def distill_loss(model, snippets: list[Snippet], targets: list[torch.Tensor], rows: torch.Tensor, batch: int) -> float:
    """Mean squared difference between student and teacher hidden states over every loss position (no update)."""
    student = Student(model)
    decoder = _decoder(model)
    total, count = 0.0, 0
    with torch.no_grad():
        for group in _batches(snippets, batch):
            sq, n = _student_error(decoder, student, snippets, targets, group, rows.to(student.device))
            total += float(sq)
            count += n
    return total / max(count, 1)


def _student_error(decoder, student, snippets, targets, group, rows) -> tuple[torch.Tensor, int]:
    ids, mask = _pad([snippets[i].student for i in group], 0, student.device)
    hidden = decoder(inputs_embeds=student.inputs(ids, rows), attention_mask=mask).last_hidden_state
    b = torch.cat([torch.full((len(snippets[i].loss_student),), row) for row, i in enumerate(group)])
    pos = torch.cat([torch.from_numpy(snippets[i].loss_student) for i in group])
    wanted = torch.cat([targets[i] for i in group])
    diff = hidden[b.to(student.device), pos.to(student.device)].float() - wanted
    return diff.square().sum(), diff.numel()


def train_input_rows(
    model,
    snippets: list[Snippet],
    targets: list[torch.Tensor],
    start: torch.Tensor,
    trainable: torch.Tensor,
    *,
    epochs: int,
    batch: int,
    lr: float,
    seed: int,
    head: HeadObjective | None = None,
    head_weight: float = 0.0,
    show_progress: bool = True,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Optimize the new rows (``start``, only ``trainable`` ones move) so that the student matches the teacher;
    with a tied head also ``head`` (the same rows as output rows), weighted by ``head_weight`` (both relative to
    their value at the start)."""
    student = Student(model)
    decoder = _decoder(model)
    rows = start.clone().to(student.device, torch.float32).requires_grad_(True)
    optimizer = RowAdam(rows, lr)
    groups = _batches(snippets, batch)
    generator = torch.Generator().manual_seed(seed)
    use_head = head is not None and head_weight > 0
    if use_head:
        head_start, _ = head(rows.detach())
        head_scale = head_weight / max(float(head_start), 1e-12)
    history: list[dict[str, float]] = []
    scale = None  # 1 / the first batch's distillation loss: the unit the head loss is weighed against
    bar = progress(total=epochs * len(groups), desc="distill", unit="batch", disable=not show_progress)
    for _ in range(epochs):
        squared, count, head_total = 0.0, 0, 0.0
        for g in torch.randperm(len(groups), generator=generator).tolist():
            group = groups[g]
            with torch.enable_grad():
                sq, n = _student_error(decoder, student, snippets, targets, group, rows)
                loss = sq / n
                (grad,) = torch.autograd.grad(loss, rows)
            squared += float(sq.detach())
            count += n
            if scale is None:
                scale = 1.0 / max(float(loss.detach()), 1e-12)
            grad = grad * scale
            active = grad.abs().sum(dim=1) > 0
            if use_head:
                head_loss, head_grad = head(rows.detach())
                grad = grad + head_scale * head_grad
                head_total = float(head_loss)
                active = torch.ones_like(active)
            grad[~trainable] = 0
            optimizer.step(grad, active & trainable)
            bar.update(1)
        entry = {"distill_mse": squared / max(count, 1)}
        if use_head:
            entry["head_loss"] = head_total
        history.append(entry)
    bar.close()
    return rows.detach(), {"epochs": history}


@contextmanager
def frozen(model):
    """The model in eval mode with no parameter requiring a gradient, restored afterwards: the teacher is
    deterministic, and the student's backward pass reaches only the new rows."""
    training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(training)
