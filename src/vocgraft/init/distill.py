"""Distillation initialization: new input rows learned from the frozen model itself, and calibrated output rows.

**Input rows** (Token Distillation, Dobler, Elliott & de Melo 2025, arXiv 2505.20133). Subword averaging only
looks at the embedding matrix, but a word spelled by several pieces is put together by the model's first layers.
So: take corpus snippets that contain the new token, run the frozen source model on the snippet as the *source*
tokenizer spells it (the teacher), and optimize the new rows so that the model fed the snippet with the new token
(the student) produces the same final hidden states at the new token (matched with the teacher's state after the
token's last old piece) and at every position after it. Only the new rows are trained; the model is frozen and
never written to. As in the paper: start from Mean, MSE on the last layer's (normed) hidden states, snippets
centred on an occurrence, a BOS-like prefix token, Adam.

Where we differ, and why (each a setting):

- ``distill_merge``: the paper merges only the snippet's own token (``one``, the default); ``all`` (ours) spells
  the snippet as the expanded tokenizer does, every new token merged, so a row is trained in the company it will
  keep and one snippet trains every new token in it (far fewer forward passes for large k). Measured on SmolLM2,
  Greek, k=100, untied head (``benchmarks/results/distill.md``): ``all`` 2.161 bits/byte, ``one`` 2.187 (source
  2.245), with half the snippets (403 vs 784).
- the teacher runs once (its states are cached), snippets are batched over many tokens, and each row takes an
  Adam step only when its token is in the batch (a lazy per-row Adam: rows are independent problems); the
  learning rate is in units of the source rows' RMS, so one setting fits models of any embedding scale.

**Output rows** (our addition; the paper trains untied heads by next-token prediction and leaves tied ones alone).
A tied head scores a new token with its input row: a Mean-like row gives logit h·mean(pieces), which rarely beats
the first piece's h·e_1, so the model keeps spelling words with old pieces; a distilled input row used as an output
row is worse still (it fires everywhere: +23% bits/byte on Greek, k=100, in an exploratory run not recorded in
``benchmarks/results``). The source model says how likely the new
token is: q = Π_i p(piece_i | context, earlier pieces), read off one teacher pass. The row is fitted so that the
new token gets probability q next to the frozen old logits (``p = q`` is the cross-entropy optimum for one added
logit, i.e. logit ``logsumexp(old logits) + log q − log(1 − q)``). Every teacher position that ends a target token
is a context; for every new token whose first piece follows there the teacher's own logits give q exactly when the
text goes on with the token's pieces (all but possibly the last), and an upper bound otherwise (the product up to
the first piece that differs); a sample of other contexts bounds q by the first piece's probability. The loss is
KL(q || p) per pair (bounds: only where p exceeds them), not least squares on logits, which spends the fit on
contexts where the token is improbable anyway (least squares: +6.6% bits/byte where KL gives −3.8%, Greek
k=100, exploratory runs not recorded in ``benchmarks/results``).

``distill_target takeover`` (a named variant): in the expanded model the first piece followed by the token's other
pieces is never how the tokenizer spells the text, so the token may take the share r = q / p(first piece) of its
first piece's probability that goes on into it (new logit lse + log q − log(1 − r)): then greedy decoding picks the
token wherever r > 1/2. Measured (Greek, k=100): 2.160 bits/byte against 2.161 for ``sequence`` and no new token in
greedy output for either, so the default stays ``sequence``.

- untied source, or ``untie_head`` (the default): the head pass fits the head rows, starting from the first
  piece's head row (so the first factor of q is right from the start), with a ridge pull towards it;
- tied source kept tied (``--no-untie-head``): one row serves both goals; ``distill_head_weight`` weighs the
  calibration loss next to the distillation loss (each relative to its value at the start); 0 is the paper's
  input-only objective.

``untie_head`` is read by the recipe (``recipes.common.init_and_graft``): it gives a tied model its own head
before the init stage, so the saved model is untied (+|V| x hidden parameters). It is the default because it
measured best (``benchmarks/results/distill.md``, SmolLM2, Greek, k=100: 2.161 bits/byte untied against 2.295
with one row for both goals; the source 2.245).

New tokens that never occur in the corpus keep their start rows (input: ``distill_start``; head: Mean of head
rows). In replace mode the same applies to new tokens the source tokenizer cannot spell byte for byte.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vocgraft.init import InitContext, Option, check_source_matrix, get_method, register, source_blocks
from vocgraft.init.mean import source_pieces, target_forms
from vocgraft.progress import progress
from vocgraft.tokenization.canonical import canonical_tokens

MERGES = ("all", "one")
STARTS = ("mean", "align")
TARGETS = ("sequence", "takeover")
MAX_R = 0.99  # takeover: share of the first piece's probability the new token may take over (finite logits)
LINES_PER_CHUNK = 4096  # corpus lines tokenized at once while looking for snippets
PAIR_CHUNK = 65536  # calibration pairs per gathered block (bounds memory: block x hidden floats)
MAX_Q = 1 - 1e-4  # q is clipped below 1 so that log(1 - q) stays finite
NEGATIVES = 4  # per new token and teacher batch: contexts where another piece follows (bound q <= p(first piece))

OPTIONS = (
    Option(
        "distill_snippets", 8, "distill: corpus snippets per new token (the paper uses 100)", minimum=1, maximum=10_000
    ),
    Option(
        "distill_length",
        24,
        "distill: snippet length in target tokens, the new token in the middle (paper: 50)",
        minimum=1,
        maximum=4096,
    ),
    Option(
        "distill_epochs",
        2,
        "distill: passes over the snippets (a row takes one step per batch with its token)",
        minimum=0,
        maximum=1000,
        inert=(0,),
    ),
    Option(
        "distill_lr",
        0.05,
        "distill: Adam learning rate, in units of the source rows' RMS",
        minimum=0,
        above=True,
        maximum=100,
    ),
    Option(
        "distill_batch",
        8,
        "distill: snippets per forward pass (smaller: more steps per row for the same work)",
        minimum=1,
        maximum=4096,
    ),
    Option(
        "distill_merge",
        "one",
        "distill: which new tokens a snippet spells with their new id: one (the snippet's own token, the paper's "
        "form) or all (ours: every new token, as the expanded tokenizer spells it)",
        choices=MERGES,
    ),
    Option(
        "distill_start",
        "mean",
        "distill: start rows, and rows of tokens without snippets: mean or align",
        choices=STARTS,
    ),
    Option(
        "distill_head_weight",
        1.0,
        "distill, tied head: weight of the output-calibration loss next to the distillation loss (0: input "
        "goal only, the paper's form)",
        minimum=0,
        maximum=1000,
    ),
    Option(
        "distill_target",
        "sequence",
        "distill: what new output rows are fitted to: sequence (p = the source's probability of the token's "
        "pieces) or takeover (the new token takes the share of its first piece's probability that goes on into "
        "it, so greedy decoding picks it where the source would spell it out)",
        choices=TARGETS,
    ),
    Option(
        "distill_ridge",
        0.3,
        "distill, untied head: pull of the head rows towards their first piece's row",
        minimum=0,
        maximum=1e6,
    ),
    Option(
        "untie_head",
        True,
        "distill: give a tied model its own LM head first, so input and output rows are fitted separately (the "
        "output is untied, +|V| x hidden parameters); --no-untie-head keeps one row for both",
    ),
)


# ------------------------------------------------------------------------------------------------------------
# snippets


@dataclass
class Snippet:
    """One training context. Positions count the prefix token as 0 in both sequences.

    ``student`` holds a source id (>= 0) where the student reads a frozen source row and ``-(1 + j)`` where it
    reads new row ``j`` (the index into ``plan.new_ids``)."""

    student: np.ndarray
    teacher: np.ndarray  # source ids
    loss_student: np.ndarray  # student positions whose final hidden states are matched ...
    loss_teacher: np.ndarray  # ... with these teacher positions
    contexts: np.ndarray  # teacher positions that end a target token: where output rows are calibrated


@dataclass
class Vocab:
    """What the snippet builder needs to know about the two tokenizers and the plan."""

    source_of_target: np.ndarray  # copied target id -> source id, else -1
    new_index: np.ndarray  # target id -> index into plan.new_ids, else -1
    trainable: np.ndarray  # per new index: the source spells the token byte for byte
    target_bytes: np.ndarray  # byte length per target id (-1: special/unknown)
    source_bytes: np.ndarray
    prefix: int  # the source id put before every snippet (BOS, else EOS)


def byte_lengths(tokenizer) -> np.ndarray:
    forms = canonical_tokens(tokenizer)
    return np.fromiter((-1 if f is None else len(f) for f in forms), dtype=np.int64, count=len(forms))


def prefix_id(tokenizer) -> int:
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError("distill needs a BOS or EOS token in the source tokenizer to start every snippet with.")


def _ends(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    if len(ids) == 0 or ids.max() >= len(lengths):
        return None
    sizes = lengths[ids]
    return None if (sizes < 0).any() else np.cumsum(sizes)


def _line_ends(t_ids: np.ndarray, s_ids: np.ndarray, vocab: Vocab) -> tuple[np.ndarray, np.ndarray] | None:
    """Byte end of every target and source token of one line, in one coordinate system; None when the two
    tokenizations do not spell the same bytes (unknown pieces, normalization)."""
    t_end, s_end = _ends(t_ids, vocab.target_bytes), _ends(s_ids, vocab.source_bytes)
    if t_end is None or s_end is None:
        return None
    extra = int(t_end[-1] - s_end[-1])
    if extra == 1:  # a word-start marker one tokenizer adds before the line (SentencePiece): not text
        t_end = np.maximum(t_end - 1, 0)
    elif extra == -1:
        s_end = np.maximum(s_end - 1, 0)
    elif extra:
        return None
    return t_end, s_end


def _window(i: int, n: int, length: int, common_end: np.ndarray) -> tuple[int, int]:
    """Target tokens [s, e) around token i: up to ``length`` tokens, i in the middle where the line allows,
    widened to start and end on byte boundaries both tokenizations share."""
    s = max(0, i - (length - 1) // 2)
    e = min(n, s + length)
    s = max(0, min(s, e - length))
    while s > 0 and not common_end[s - 1]:
        s -= 1
    while e < n and not common_end[e - 1]:
        e += 1
    return s, e


def _snippet(
    t_ids: np.ndarray,
    s_ids: np.ndarray,
    t_end: np.ndarray,
    s_end: np.ndarray,
    common: np.ndarray,
    window: tuple[int, int],
    occurrence: int,
    merge: str,
    vocab: Vocab,
) -> Snippet | None:
    s, e = window
    start_byte = int(t_end[s - 1]) if s else 0
    end_byte = int(t_end[e - 1])
    a = int(np.searchsorted(s_end, start_byte, side="right"))  # first source token ending inside the window
    b = int(np.searchsorted(s_end, end_byte, side="left")) + 1
    teacher = np.concatenate([[vocab.prefix], s_ids[a:b]])
    # teacher position of each target token that ends on a shared boundary (prefix = 0)
    src_pos = np.searchsorted(s_end, t_end[s:e]) - a + 1
    shared = common[s:e]
    contexts = np.concatenate([[0], src_pos[shared]]).astype(np.int64)
    new = vocab.new_index[t_ids]
    if merge == "all":
        if ((new[s:e] < 0) & (vocab.source_of_target[t_ids[s:e]] < 0)).any():
            return None  # a target token with neither a source row nor a new row (a plan that does not fit)
        student = np.where(new[s:e] >= 0, -(1 + new[s:e]), vocab.source_of_target[t_ids[s:e]])
        student = np.concatenate([[vocab.prefix], student])
        first = int(np.flatnonzero(new[s:e] >= 0)[0])
        keep = shared & (np.arange(e - s) >= first)
        loss_student = np.flatnonzero(keep) + 1
        loss_teacher = src_pos[keep]
    else:  # the paper's form: the source spelling with only this occurrence's pieces replaced by its new id
        if not (common[occurrence] and (occurrence == 0 or common[occurrence - 1])):
            return None
        lo = int(np.searchsorted(s_end, t_end[occurrence - 1] if occurrence else 0, side="right"))
        hi = int(np.searchsorted(s_end, t_end[occurrence])) + 1
        pieces = hi - lo
        student = np.concatenate([teacher[: lo - a + 1], [-(1 + new[occurrence])], teacher[hi - a + 1 :]])
        loss_student = np.arange(lo - a + 1, len(student))
        loss_teacher = loss_student + pieces - 1
    return Snippet(student.astype(np.int64), teacher.astype(np.int64), loss_student, loss_teacher, contexts)


def collect_snippets(
    lines: Sequence[str],
    source_tokenizer,
    target_tokenizer,
    vocab: Vocab,
    *,
    per_token: int,
    length: int,
    merge: str,
    seed: int,
    show_progress: bool = True,
) -> tuple[list[Snippet], np.ndarray]:
    """Snippets giving every trainable new token up to ``per_token`` occurrences, from lines in a seeded random
    order; and how many occurrences each new token got."""
    need = np.where(vocab.trainable, per_token, 0).astype(np.int64)
    got = np.zeros(len(vocab.trainable), dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(lines))
    snippets: list[Snippet] = []
    chunks = range(0, len(order), LINES_PER_CHUNK)
    bar = progress(total=int(need.sum()), desc="distill snippets", unit="occ", disable=not show_progress)
    for lo in chunks:
        if not need.any():
            break
        batch = [lines[i] for i in order[lo : lo + LINES_PER_CHUNK]]
        t_all = target_tokenizer(batch, add_special_tokens=False)["input_ids"]
        s_all = source_tokenizer(batch, add_special_tokens=False)["input_ids"]
        for t_list, s_list in zip(t_all, s_all):
            t_ids = np.asarray(t_list, dtype=np.int64)
            if len(t_ids) == 0:
                continue
            new = vocab.new_index[t_ids] if t_ids.max() < len(vocab.new_index) else None
            if new is None:
                continue
            wanted = np.flatnonzero((new >= 0) & vocab.trainable[np.maximum(new, 0)])
            wanted = wanted[need[new[wanted]] > 0]
            if len(wanted) == 0:
                continue
            s_ids = np.asarray(s_list, dtype=np.int64)
            ends = _line_ends(t_ids, s_ids, vocab)
            if ends is None:
                continue
            t_end, s_end = ends
            common = np.isin(t_end, s_end)
            covered = -1  # target tokens before this index are already in a snippet of this line ("all")
            for i in wanted.tolist():
                if i < covered or need[new[i]] <= 0:
                    continue
                window = _window(i, len(t_ids), length, common)
                snippet = _snippet(t_ids, s_ids, t_end, s_end, common, window, i, merge, vocab)
                if snippet is None:
                    continue
                snippets.append(snippet)
                if merge == "all":
                    inside = new[window[0] : window[1]]
                    inside = inside[inside >= 0]
                    inside = inside[vocab.trainable[inside]]
                    covered = window[1]
                else:
                    inside = new[i : i + 1]
                np.add.at(got, inside, 1)
                before = int(need.sum())
                np.subtract.at(need, inside, 1)
                np.maximum(need, 0, out=need)
                bar.update(before - int(need.sum()))
    bar.close()
    return snippets, got


# ------------------------------------------------------------------------------------------------------------
# the model side


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


# ------------------------------------------------------------------------------------------------------------
# the teacher pass: hidden-state targets and calibration pairs


@dataclass
class Calibration:
    """Targets for new output rows: for pair i, new token ``token[i]`` at context ``hidden[position[i]]`` should
    get probability q_i next to the old logits (log-sum-exp ``lse[i]``), i.e. logit ``lse + log_odds`` with
    ``log_odds = log q - log(1 - q)``; ``exact`` False: q_i is an upper bound."""

    hidden: torch.Tensor  # [contexts, hidden] final hidden states of the teacher
    position: torch.Tensor  # per pair: row of ``hidden``
    token: torch.Tensor  # per pair: index into plan.new_ids
    lse: torch.Tensor  # per pair: log-sum-exp of the old logits at the context
    log_odds: torch.Tensor  # per pair: log q - log(1 - q)
    exact: torch.Tensor  # per pair: bool
    log_first: torch.Tensor | None = None  # per pair: log p(first piece) at the context (0 for negatives)

    def to(self, device) -> Calibration:
        fields = (self.hidden, self.position, self.token, self.lse, self.log_odds, self.exact, self.log_first)
        return Calibration(*(None if t is None else t.to(device) for t in fields))

    def targeting(self, target: str) -> Calibration:
        """The same pairs with the log odds of ``target`` (see ``TARGETS``).

        ``takeover``: in the expanded model the first piece followed by the token's other pieces is never how the
        tokenizer spells the text, so the share r = q / p(first piece) of the first piece's probability that goes
        on into the token belongs to the token. With the old logits frozen, the new logit that gives the token
        and its first piece the ratio q : p1 - q is lse + log q - log(1 - r). Negatives (another first piece
        follows) keep the sequence bound: there r is unknown."""
        if target == "sequence":
            return self
        if target != "takeover":
            raise ValueError(f"--distill-target must be one of {', '.join(TARGETS)}; got {target!r}.")
        if self.log_first is None:
            raise ValueError("takeover needs the first piece's probability per pair (Calibration.log_first).")
        log_q = F.logsigmoid(self.log_odds)
        log_r = (log_q - self.log_first).clamp(max=math.log(MAX_R))
        log_r = torch.where(self.log_first < 0, log_r, log_q)  # negatives: r = q, the sequence target
        odds = log_q - torch.log1p(-log_r.exp())
        return Calibration(self.hidden, self.position, self.token, self.lse, odds, self.exact, self.log_first)


class PieceTable:
    """Every new token's source pieces as a padded matrix, and the tokens grouped by first piece."""

    def __init__(self, pieces: list[list[int]], usable: np.ndarray) -> None:
        width = max([len(p) for p in pieces] + [1])
        self.width = width
        self.pieces = np.full((len(pieces), width), -1, dtype=np.int64)
        for j, p in enumerate(pieces):
            self.pieces[j, : len(p)] = p
        self.count = np.array([len(p) for p in pieces], dtype=np.int64)
        tokens = np.flatnonzero(usable & (self.count >= 1))
        first = self.pieces[tokens, 0]
        order = np.argsort(first, kind="stable")
        self.by_first = tokens[order]  # token indices sorted by first piece
        self.first_sorted = first[order]

    def starting_with(self, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(context index, token index) for every token whose first piece is ``first[context]``."""
        lo = np.searchsorted(self.first_sorted, first, side="left")
        hi = np.searchsorted(self.first_sorted, first, side="right")
        counts = hi - lo
        ctx = np.repeat(np.arange(len(first)), counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return ctx, self.by_first[np.repeat(lo, counts) + offsets]


def _calibration_pairs(
    logits: torch.Tensor,
    teacher: torch.Tensor,
    lengths: torch.Tensor,
    ctx_batch: np.ndarray,
    ctx_pos: np.ndarray,
    table: PieceTable,
    negatives: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(context, token, log-sum-exp of the old logits, log odds of q, exact, log p(first piece) or 0 for a
    negative) for one teacher batch; contexts are indices into ctx_batch/ctx_pos."""
    device = logits.device
    logp = torch.log_softmax(logits, dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    teacher_np = teacher.cpu().numpy()
    lengths_np = lengths.cpu().numpy()
    # what follows each context in the teacher's text, piece by piece (-2 past the end)
    steps = np.arange(1, table.width + 1)
    follow_pos = ctx_pos[:, None] + steps[None, :]
    inside = follow_pos < lengths_np[ctx_batch][:, None]
    observed = np.where(inside, teacher_np[ctx_batch[:, None], np.minimum(follow_pos, teacher_np.shape[1] - 1)], -2)
    ctx, tok = table.starting_with(observed[:, 0])
    pieces = table.pieces[tok]  # [pairs, width]
    count = table.count[tok]
    # leading pieces the text agrees with; piece i is scored at position ctx_pos + i, known when that position
    # exists and the text agreed with pieces 0..i-1
    agree = np.cumprod(pieces == observed[ctx], axis=1).sum(axis=1)
    room = lengths_np[ctx_batch[ctx]] - ctx_pos[ctx]
    stop = np.minimum(np.minimum(agree + 1, count), room)
    exact = stop == count
    idx = np.arange(table.width)[None, :]
    use = idx < stop[:, None]
    b = torch.from_numpy(np.repeat(ctx_batch[ctx][:, None], table.width, axis=1)).to(device)
    p = torch.from_numpy(np.minimum(ctx_pos[ctx][:, None] + idx, teacher_np.shape[1] - 1)).to(device)
    piece = torch.from_numpy(np.maximum(pieces, 0)).to(device)
    terms = logp[b, p, piece] * torch.from_numpy(use).to(device)
    log_q = terms.sum(dim=1)
    log_first = terms[:, 0].clamp(max=math.log(MAX_Q))  # < 0 for every positive pair
    # negatives: other contexts, where q <= p(first piece)
    if negatives and len(ctx_pos) and len(table.by_first):
        n_tok = len(table.by_first)
        neg_ctx = rng.integers(0, len(ctx_pos), size=n_tok * negatives)
        neg_tok = np.repeat(table.by_first, negatives)
        keep = table.pieces[neg_tok, 0] != observed[neg_ctx, 0]
        neg_ctx, neg_tok = neg_ctx[keep], neg_tok[keep]
        first = torch.from_numpy(table.pieces[neg_tok, 0]).to(device)
        at = (torch.from_numpy(ctx_batch[neg_ctx]).to(device), torch.from_numpy(ctx_pos[neg_ctx]).to(device))
        neg_log_q = logp[at[0], at[1], first]
        ctx = np.concatenate([ctx, neg_ctx])
        tok = np.concatenate([tok, neg_tok])
        exact = np.concatenate([exact, np.zeros(len(neg_ctx), dtype=bool)])
        log_q = torch.cat([log_q, neg_log_q])
        log_first = torch.cat([log_first, torch.zeros_like(neg_log_q)])  # 0 marks a negative
    log_q = log_q.clamp(max=math.log(MAX_Q))
    ctx_lse = lse[torch.from_numpy(ctx_batch[ctx]).to(device), torch.from_numpy(ctx_pos[ctx]).to(device)]
    log_odds = log_q - torch.log1p(-log_q.exp())
    return ctx, tok, ctx_lse.cpu().numpy(), log_odds.cpu().numpy(), exact, log_first.cpu().numpy()


def teacher_pass(
    model, snippets: list[Snippet], table: PieceTable, *, batch: int, negatives: int, seed: int, show_progress: bool
) -> tuple[list[torch.Tensor], Calibration]:
    """The frozen model over every snippet as the source spells it, once: the hidden states the student must
    reproduce (per snippet, at ``loss_teacher``), and the calibration pairs of the output rows."""
    decoder = _decoder(model)
    device = next(model.parameters()).device
    targets: list[torch.Tensor | None] = [None] * len(snippets)
    rng = np.random.default_rng(seed)
    hidden_parts, pos_parts, tok_parts, lse_parts, odds_parts, exact_parts, first_parts = [], [], [], [], [], [], []
    n_contexts = 0
    groups = _batches(snippets, batch, "teacher")
    bar = progress(groups, desc="distill teacher", unit="batch", disable=not show_progress or len(groups) < 2)
    with torch.no_grad():
        for group in bar:
            ids, mask = _pad([snippets[i].teacher for i in group], 0, device)
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
            for row, i in enumerate(group):
                targets[i] = hidden[row, torch.from_numpy(snippets[i].loss_teacher).to(device)].float()
            ctx_batch = np.concatenate([np.full(len(snippets[i].contexts), row) for row, i in enumerate(group)])
            ctx_pos = np.concatenate([snippets[i].contexts for i in group])
            lengths = mask.sum(dim=1)
            live = ctx_pos + 1 < lengths.cpu().numpy()[ctx_batch]  # something follows the context
            ctx_batch, ctx_pos = ctx_batch[live], ctx_pos[live]
            if len(ctx_pos) == 0:
                continue
            logits = _logits(model, hidden)
            ctx, tok, ctx_lse, log_odds, exact, log_first = _calibration_pairs(
                logits, ids, lengths, ctx_batch, ctx_pos, table, negatives, rng
            )
            used = np.unique(ctx)
            remap = np.full(len(ctx_pos), -1, dtype=np.int64)
            remap[used] = np.arange(len(used)) + n_contexts
            hidden_parts.append(
                hidden[torch.from_numpy(ctx_batch[used]).to(device), torch.from_numpy(ctx_pos[used]).to(device)]
                .float()
                .cpu()
            )
            n_contexts += len(used)
            pos_parts.append(remap[ctx])
            tok_parts.append(tok)
            lse_parts.append(ctx_lse)
            odds_parts.append(log_odds)
            exact_parts.append(exact)
            first_parts.append(log_first)
    width = model.get_input_embeddings().weight.shape[1]

    def joined(parts, dtype):
        return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=dtype))

    calibration = Calibration(
        torch.cat(hidden_parts) if hidden_parts else torch.zeros(0, width),
        joined(pos_parts, np.int64),
        joined(tok_parts, np.int64),
        joined(lse_parts, np.float32).float(),
        joined(odds_parts, np.float32).float(),
        joined(exact_parts, bool),
        joined(first_parts, np.float32).float(),
    )
    return targets, calibration


# ------------------------------------------------------------------------------------------------------------
# the two objectives


def calibration_loss_and_grad(
    rows: torch.Tensor, cal: Calibration, bias: float = 0.0, anchor: torch.Tensor | None = None, ridge: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over pairs of KL(q || p) between the target probability q and the row's p = sigmoid(logit - lse)
    (bounds: only where p > q), plus ``ridge`` x |rows - anchor|^2; and its gradient with respect to ``rows``.

    Cross-entropy, not least squares on logits: a logit error where both probabilities are tiny costs nothing,
    an error where the token is likely costs what it costs in bits. Gathered in blocks, never pairs x hidden."""
    rows = rows.detach()
    grad = torch.zeros_like(rows)
    total = rows.new_zeros((), dtype=torch.float64)
    for lo in range(0, len(cal.token), PAIR_CHUNK):
        sl = slice(lo, lo + PAIR_CHUNK)
        h = cal.hidden[cal.position[sl]]
        tok = cal.token[sl]
        x = (h * rows[tok]).sum(dim=1) + bias - cal.lse[sl]
        y = cal.log_odds[sl]
        q = torch.sigmoid(y)
        # KL(q || p) for Bernoulli p = sigmoid(x): cross-entropy minus the entropy of q
        kl = q * (F.softplus(-x) - F.softplus(-y)) + (1 - q) * (F.softplus(x) - F.softplus(y))
        slope = torch.sigmoid(x) - q
        over = cal.exact[sl] | (x > y)  # a bound only binds above it
        total = total + torch.where(over, kl, torch.zeros_like(kl)).sum().double()
        grad.index_add_(0, tok, torch.where(over, slope, torch.zeros_like(slope)).unsqueeze(1) * h)
    if ridge and anchor is not None:
        diff = rows - anchor
        total = total + ridge * diff.square().sum().double()
        grad += 2 * ridge * diff
    return total.float(), grad


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
    calibration: Calibration | None = None,
    head_weight: float = 0.0,
    head_bias: float = 0.0,
    show_progress: bool = True,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Optimize the new rows (``start``, only ``trainable`` ones move) so that the student matches the teacher;
    with a tied head also the calibration loss, weighted by ``head_weight`` (both relative to their start)."""
    student = Student(model)
    decoder = _decoder(model)
    rows = start.clone().to(student.device, torch.float32).requires_grad_(True)
    optimizer = RowAdam(rows, lr)
    groups = _batches(snippets, batch)
    generator = torch.Generator().manual_seed(seed)
    use_head = calibration is not None and head_weight > 0 and len(calibration.token) > 0
    if use_head:
        calibration = calibration.to(student.device)
        head_start, _ = calibration_loss_and_grad(rows, calibration, head_bias)
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
                head_loss, head_grad = calibration_loss_and_grad(rows, calibration, head_bias)
                grad = grad + head_scale * head_grad
                head_total = float(head_loss)
                active = torch.ones_like(active)
            grad[~trainable] = 0
            optimizer.step(grad, active & trainable)
            bar.update(1)
        entry = {"distill_mse": squared / max(count, 1)}
        if use_head:
            entry["calibration_kl"] = head_total
        history.append(entry)
    bar.close()
    return rows.detach(), {"epochs": history}


def fit_head_rows(
    calibration: Calibration, anchor: torch.Tensor, fit: torch.Tensor, ridge: float, bias: float, iterations: int = 200
) -> tuple[torch.Tensor, dict[str, float]]:
    """Output rows minimizing the calibration loss + ridge x |row - anchor|^2 per token (L-BFGS); rows of tokens
    without a pair (``fit`` False) stay at ``anchor``."""
    if len(calibration.token) == 0:
        return anchor.clone(), {"calibration_kl_start": 0.0, "calibration_kl_end": 0.0}
    h2 = float(calibration.hidden.square().sum(dim=1).mean())
    lam = ridge * h2  # shrinkage n / (n + ridge) for n pairs of similar contexts: ridge is dimensionless
    rows = anchor.clone().requires_grad_(True)
    start, _ = calibration_loss_and_grad(anchor, calibration, bias)
    optimizer = torch.optim.LBFGS([rows], lr=1, max_iter=iterations, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        loss, grad = calibration_loss_and_grad(rows, calibration, bias, anchor, lam)
        rows.grad = grad * fit.unsqueeze(1)
        return loss

    optimizer.step(closure)
    end, _ = calibration_loss_and_grad(rows, calibration, bias)
    out = torch.where(fit.unsqueeze(1), rows.detach(), anchor)
    return out, {"calibration_kl_start": float(start), "calibration_kl_end": float(end)}


# ------------------------------------------------------------------------------------------------------------
# the method


def _vocab(ctx: InitContext) -> Vocab:
    plan = ctx.plan
    n_target = len(plan.target_tokens)
    source_of_target = np.full(n_target, -1, dtype=np.int64)
    for t, s in plan.copied.items():
        source_of_target[t] = s
    new_index = np.full(n_target, -1, dtype=np.int64)
    new_index[np.asarray(plan.new_ids, dtype=np.int64)] = np.arange(len(plan.new_ids))
    pieces, exact = _pieces(ctx)
    trainable = np.array([e and len(p) > 0 for p, e in zip(pieces, exact)], dtype=bool)
    return Vocab(
        source_of_target,
        new_index,
        trainable,
        byte_lengths(ctx.target_tokenizer),
        byte_lengths(ctx.source_tokenizer),
        prefix_id(ctx.source_tokenizer),
    )


def _pieces(ctx: InitContext) -> tuple[list[list[int]], list[bool]]:
    cached = ctx.resources.get("distill_pieces")
    if cached is None:
        forms = target_forms(ctx.plan, ctx.plan.new_ids, ctx.target_tokenizer)
        pairs = [source_pieces(ctx.source_tokenizer, f, ctx.n_source) if f else ([], False) for f in forms]
        cached = ctx.resources["distill_pieces"] = ([p for p, _ in pairs], [e for _, e in pairs])
    return cached


def _prepare(ctx: InitContext) -> dict[str, Any]:
    """Snippets and the teacher pass, once per model (the head pass of an untied model reuses them)."""
    opts = ctx.options
    # what the snippets and the teacher pass depend on besides the plan, corpus and model; a cache made with
    # other settings (a caller reusing resources across runs) is not reused
    key = tuple(opts[name] for name in ("distill_snippets", "distill_length", "distill_merge")) + (ctx.seed,)
    cached = ctx.resources.get("distill_data")
    if cached is not None and cached["key"] == key:
        if "distill_stats" not in ctx.resources:  # a new run on the same data: its own statistics
            ctx.resources["distill_stats"] = {**cached["stats"], "teacher_reused": True}
        return cached
    if opts["distill_merge"] not in MERGES:
        raise ValueError(f"--distill-merge must be one of {', '.join(MERGES)}; got {opts['distill_merge']!r}.")
    for name in ("distill_snippets", "distill_length", "distill_batch"):
        if opts[name] < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1; got {opts[name]}.")
    show = len(ctx.plan.new_ids) > 50
    t0 = time.perf_counter()
    vocab = _vocab(ctx)
    snippets, got = collect_snippets(
        ctx.corpus or [],
        ctx.source_tokenizer,
        ctx.target_tokenizer,
        vocab,
        per_token=opts["distill_snippets"],
        length=opts["distill_length"],
        merge=opts["distill_merge"],
        seed=ctx.seed,
        show_progress=show,
    )
    t1 = time.perf_counter()
    pieces, _ = _pieces(ctx)
    table = PieceTable(pieces, vocab.trainable)
    targets, calibration = teacher_pass(
        ctx.model, snippets, table, batch=opts["distill_batch"], negatives=NEGATIVES, seed=ctx.seed, show_progress=show
    )
    t2 = time.perf_counter()
    covered = got > 0
    data = {
        "key": key,
        "snippets": snippets,
        "targets": targets,
        "calibration": calibration,
        "covered": covered,
        "stats": {
            "snippets": len(snippets),
            "student_tokens": int(sum(len(s.student) for s in snippets)),
            "teacher_tokens": int(sum(len(s.teacher) for s in snippets)),
            "tokens_trained": int(covered.sum()),
            "tokens_without_snippets": int((~covered).sum()),
            "tokens_not_spelled_by_source": int((~vocab.trainable).sum()),
            "calibration_pairs": len(calibration.token),
            "calibration_exact_pairs": int(calibration.exact.sum()),
            "snippet_seconds": t1 - t0,
            "teacher_seconds": t2 - t1,
            "device": str(next(ctx.model.parameters()).device),
        },
    }
    ctx.resources["distill_data"] = data
    ctx.resources["distill_stats"] = dict(data["stats"])
    return data


def _head_bias(model, n_source: int) -> float:
    head = model.get_output_embeddings()
    bias = getattr(head, "bias", None) if head is not None else None
    return float(bias.detach().float()[:n_source].mean()) if bias is not None else 0.0


def _rms(matrix: torch.Tensor, ctx: InitContext) -> float:
    """Root mean square of the real source rows' entries (the step size scales with it), block by block."""
    squares, count = 0.0, 0
    for rows in source_blocks(matrix, ctx):
        squares += float(rows.square().sum(dtype=torch.float64))
        count += rows.numel()
    return math.sqrt(squares / max(count, 1))


def _tied(model) -> bool:
    head = model.get_output_embeddings()
    return head is None or head.weight is model.get_input_embeddings().weight


@register(
    "distill",
    needs=("corpus", "model"),
    options=OPTIONS,
    summary="new input rows distilled from the frozen model's hidden states on corpus snippets (Token "
    "Distillation); output rows calibrated to the source's probability of the token's pieces",
    reference="Dobler, Elliott & de Melo 2025, arXiv 2505.20133 (input rows); output calibration: vocgraft",
)
def distill(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    """Distilled input rows (``ctx.space == "input"``) or calibrated head rows (``"head"``, untied models)."""
    if ctx.corpus is None:
        raise ValueError("init method 'distill' needs a corpus: pass the target-language text (--corpus).")
    if ctx.model is None:
        raise ValueError("init method 'distill' runs the source model; call it through vocgraft.init.initialize.")
    opts = ctx.options
    if opts["distill_start"] not in STARTS:
        raise ValueError(f"--distill-start must be one of {', '.join(STARTS)}; got {opts['distill_start']!r}.")
    if opts["distill_target"] not in TARGETS:
        raise ValueError(f"--distill-target must be one of {', '.join(TARGETS)}; got {opts['distill_target']!r}.")
    matrix = source_matrix.detach().cpu()  # start rows and head fit on the CPU; forward passes on the model's device
    check_source_matrix(matrix, ctx)
    start = get_method(opts["distill_start"])(matrix, ctx)
    model = ctx.model
    with frozen(model):
        data = _prepare(ctx)
        stats = ctx.resources["distill_stats"]
        if ctx.space == "head":
            return _head_rows(matrix, start, data, ctx, stats)
        t0 = time.perf_counter()
        tied = _tied(model)
        # an untied model's input rows do not depend on the head settings: a caller trying several (a benchmark
        # passing the resources on) trains them once
        key = (data["key"], *(opts[n] for n in ("distill_epochs", "distill_batch", "distill_lr", "distill_start")))
        cached = ctx.resources.get("distill_input")
        if not tied and cached is not None and cached["key"] == key:
            stats["input"] = {**cached["history"], "reused": True}
            return cached["rows"].clone()
        device = next(model.parameters()).device
        rows, history = train_input_rows(
            model,
            data["snippets"],
            data["targets"],
            start,
            torch.from_numpy(data["covered"]).to(device),
            epochs=opts["distill_epochs"],
            batch=opts["distill_batch"],
            lr=opts["distill_lr"] * _rms(matrix, ctx),
            seed=ctx.seed,
            calibration=data["calibration"].targeting(opts["distill_target"]) if tied else None,
            head_weight=opts["distill_head_weight"] if tied else 0.0,
            head_bias=_head_bias(model, ctx.n_source),
            show_progress=len(ctx.plan.new_ids) > 50,
        )
    stats["input"] = {**history, "seconds": time.perf_counter() - t0, "tied_head": tied}
    if not tied:
        ctx.resources["distill_input"] = {"key": key, "rows": rows.cpu(), "history": stats["input"]}
    return rows.cpu()


def _head_rows(matrix: torch.Tensor, start: torch.Tensor, data: dict, ctx: InitContext, stats: dict) -> torch.Tensor:
    """Head rows fitted to the calibration pairs, from the first piece's head row; tokens without an exact pair
    keep their start rows."""
    pieces, _ = _pieces(ctx)
    first = torch.tensor([p[0] if p else 0 for p in pieces], dtype=torch.long)
    has_first = torch.tensor([bool(p) for p in pieces])
    anchor = torch.where(has_first.unsqueeze(1), matrix[first], start)
    cal = data["calibration"].targeting(ctx.options["distill_target"])
    fit = torch.zeros(len(pieces), dtype=torch.bool)
    fit[cal.token[cal.exact]] = True
    fit &= has_first
    t0 = time.perf_counter()
    bias = _head_bias(ctx.model, ctx.n_source)
    rows, fit_stats = fit_head_rows(cal, anchor, fit, ctx.options["distill_ridge"], bias)
    stats["head"] = {**fit_stats, "rows_fitted": int(fit.sum()), "seconds": time.perf_counter() - t0}
    return torch.where(fit.unsqueeze(1), rows, start)


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
