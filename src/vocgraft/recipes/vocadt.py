"""`vocgraft vocadt`: replace the tokenizer and learn the new embeddings as adapters over the frozen model.

target tokenizer (given, or trained on the corpus mix) -> plan (overlap by canonical bytes) -> adapter A0 per
matrix -> adapter training with the LAPT trainer (strategy ``vocadt``: only A trains) -> ``A @ E_old`` grafted
into a plain model with the new vocabulary. ``adapters="separate"`` (the paper's form) saves a tied source as an
untied model; ``"shared"`` keeps it tied.

    vocadt_model(VocadtSettings(alpha=0.1), TrainConfig(model="smollm2", corpus="el.txt", out="out/el-vocadt"))
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from vocgraft.settings.common import VOCAB_SIZE
from vocgraft.settings.vocadt import ADAPTERS, ALPHA, MAX_CANDIDATES
from vocgraft.train.data import TrainingError
from vocgraft.train.lapt import PreparedModel, TrainConfig, train


@dataclass
class VocadtSettings:
    tokenizer: str | None = None  # the target tokenizer; default: train one on the corpus (mix)
    kind: str | None = None  # kind of the trained target tokenizer (default: the source's family)
    # the defaults are the declared settings' (vocgraft.settings.vocadt)
    vocab_size: int = VOCAB_SIZE.default
    alpha: float = ALPHA.default  # aux-loss weight; paper 004: 0.1 for non-Latin scripts, 0 for Latin
    candidates: int | None = MAX_CANDIDATES.default  # K nearest old rows per new row (sparse form); None: dense
    adapters: str = ADAPTERS.default  # separate input and output adapters (the paper's) or one shared adapter

    @classmethod
    def from_flags(cls, flags: dict) -> VocadtSettings:
        """From `vocgraft vocadt`'s flags or a pipeline's ``adapt.vocadt`` section (by name): ``--dense`` is the
        dense adapter, else ``--max-candidates`` K."""
        return cls(
            tokenizer=flags.get("tokenizer"),
            kind=flags.get("kind"),
            vocab_size=flags["vocab_size"],
            alpha=flags["alpha"],
            candidates=None if flags["dense"] else flags["max_candidates"],
            adapters=flags["adapters"],
        )

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def describe_adapters(facts: dict) -> str:
    """The adapters' facts (``summary["vocadt"]``) in one line: form, how rows started, memory of their training."""
    memory = {k: f"{v / 2**20:,.0f} MiB" for k, v in facts["memory"].items()}
    return (
        f"{facts['adapters']} {facts['form']} adapters (x{facts['adapter_modules']}): rows started as "
        f"{facts['rows_started_as']}, aux loss over {facts['aux_loss_rows']} shared-vocabulary rows; "
        f"adapter training state {memory}"
    )


def check_dense_memory(settings: VocadtSettings, model_spec: str) -> None:
    """Before anything is loaded: refuse a dense |Vnew| x |Vold| adapter whose training state (weights, gradients,
    AdamW moments) cannot fit in the memory available, with the size and the flag that helps."""
    from transformers import AutoConfig

    from vocgraft.devices import check_memory
    from vocgraft.models import load_tokenizer, resolve
    from vocgraft.train.vocadt import adapter_memory

    n_old = AutoConfig.from_pretrained(resolve(model_spec)).vocab_size
    n_new = len(load_tokenizer(settings.tokenizer)) if settings.tokenizer else settings.vocab_size
    modules = 1 if settings.adapters == "shared" else 2
    needed = adapter_memory(n_new, n_old, None, adapters=modules)["dense_training_bytes"]
    check_memory(
        needed,
        f"--dense: {modules} adapter(s) of {n_new:,} x {n_old:,} with gradients and AdamW state",
        "drop --dense for the sparse form (--max-candidates K keeps K old rows per new row), or lower --vocab-size.",
    )


def _saved_facts(out: str) -> dict | None:
    import json
    from pathlib import Path

    manifest = json.loads((Path(out) / "vocgraft.json").read_text(encoding="utf-8"))
    return manifest.get("vocadt")


def vocadt_model(settings: VocadtSettings, config: TrainConfig) -> dict:
    """Build the adapters, train them, save the merged model to ``config.out``; returns the training summary
    with the adapter's facts under ``"vocadt"``."""
    from vocgraft.corpus import read_corpus
    from vocgraft.models import dtype_choice, load_model, load_tokenizer
    from vocgraft.outdir import check_writable
    from vocgraft.plan import VocabPlan
    from vocgraft.recipes.replace import target_tokenizer_for
    from vocgraft.surgery import graft
    from vocgraft.train.lapt import finished_summary
    from vocgraft.train.strategies import ADAPTERS
    from vocgraft.train.vocadt import (
        ADAPTER_FORMS,
        adapter_memory,
        adapter_start,
        attach_adapters,
        aux_loss,
        merged_weights,
    )

    if settings.adapters not in ADAPTER_FORMS:
        raise TrainingError(f"--adapters must be one of {', '.join(ADAPTER_FORMS)}; got {settings.adapters!r}.")
    if settings.alpha < 0:
        raise TrainingError(f"--alpha must be >= 0; got {settings.alpha}.")
    # VocADT's own strategy and objective, whatever the config's (the default recipe's 2x2 + MTP): only the adapters
    # train, with the CLM loss (an MTP head would need its own adapter)
    config = dataclasses.replace(config, strategy=ADAPTERS, objective="clm", adapter=settings.as_dict())
    if config.resume and finished_summary(config) is not None:
        # killed after its model was saved: train() says so and removes what is left, without building anything
        summary = train(config)
        summary["vocadt"] = _saved_facts(config.out)
        return summary
    check_writable(config.out, config.overwrite)  # before minutes of work
    if settings.candidates is None:
        check_dense_memory(settings, config.model)
    timings = {}
    start = time.perf_counter()
    # loaded on the CPU for accelerate to place, in the dtype the training device computes well
    model, source_tokenizer = load_model(config.model, dtype_choice(config.model, config.dtype, config.device), "cpu")
    given = load_tokenizer(settings.tokenizer) if settings.tokenizer else None
    lines = [] if given else read_corpus(config.corpus, sample=config.sample, seed=config.seed, field=config.field)
    target = target_tokenizer_for(
        source_tokenizer, lines, given, kind=settings.kind, vocab_size=settings.vocab_size, seed=config.seed
    )
    plan = VocabPlan.from_tokenizers(source_tokenizer, target, "replace")
    timings["tokenizer_and_plan_seconds"] = time.perf_counter() - start

    start = time.perf_counter()
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is emb.weight
    from vocgraft.devices import resolve_device

    # the neighbour search on the training device (a GPU when there is one): the matrices stay in their dtype
    build = dict(candidates=settings.candidates, seed=config.seed, device=resolve_device(config.device))
    input_start = adapter_start(emb.weight, plan, source_tokenizer, target, **build)
    if settings.adapters == "shared" or head is None:
        head_start = None
    elif tied:  # the head's space is the input matrix: the same start, a separate adapter (built once)
        head_start = input_start
    else:
        head_start = adapter_start(head.weight, plan, source_tokenizer, target, **build)
    adapters = attach_adapters(model, input_start, head_start)
    timings["adapter_init_seconds"] = time.perf_counter() - start

    width = input_start.weight.shape[1] if settings.candidates is not None else None
    facts = {
        "form": "dense" if settings.candidates is None else "sparse",
        "adapters": settings.adapters,
        "adapter_modules": len(adapters),
        "tied_source": tied,
        "width": width,
        "rows_started_as": input_start.counts,
        "one_hot_by_match_kind": plan.match_counts(),
        "aux_loss_rows": len(input_start.overlap_rows),  # the shared vocabulary (SHARED_KINDS)
        "memory": adapter_memory(len(plan.target_tokens), len(plan.source_tokens), width, adapters=len(adapters)),
        "timings": timings,
    }
    everything_new = dataclasses.replace(plan, copied={}, match_kind={})  # every row now comes from A @ E_old

    def merge(trained):
        new_input, new_head = merged_weights(trained)
        return graft(trained, everything_new, new_input, new_head, target)

    prepared = PreparedModel(
        model,
        target,
        extra_loss=aux_loss(adapters, settings.alpha),
        finalize=merge,
        manifest={"method": {"stage": "vocadt", **settings.as_dict()}, "plan": plan.summary(), "vocadt": facts},
        extra_json={"vocgraft-plan.json": plan.to_dict()},
    )
    summary = train(config, prepared)
    summary["vocadt"] = facts
    return summary
