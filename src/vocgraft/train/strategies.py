"""Which parameters LAPT trains: full, LoRA, two-stage, 2x2 layer selection, embeddings only.

A strategy is a sequence of *phases*; each phase names how the model is set up (``configure``) and its share of
the steps. The two-stage strategies have two: embeddings + head first, then the body: ``two-stage`` goes on with
LoRA (which keeps embeddings + head trainable), as in paper 000 Table 3; ``two-stage-2x2`` with 2x2 (the bottom
two and top two layers + embeddings + head), the papers' 2-stage order with paper 003's layer selection.

Embeddings and head are always trained in place: LoRA does not copy them (peft's ``modules_to_save`` would, and
a tied head would silently untie), so a tied model stays tied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocgraft.settings.train import STAGE1_SHARE
from vocgraft.train.data import TrainingError

STRATEGIES = ("full", "lora", "two-stage", "2x2", "two-stage-2x2", "embeddings")
# two-stage strategies: what their second phase trains (the first trains embeddings + head)
SECOND_STAGE = {"two-stage": "lora", "two-stage-2x2": "2x2"}
# trains only VocADT adapter weights; `vocgraft vocadt` sets the adapters up, so it is not a `--strategy` choice
ADAPTERS = "vocadt"
LORA = {"r": 8, "lora_alpha": 32, "lora_dropout": 0.05}  # paper 000's LoRA setting, all linear layers


@dataclass(frozen=True)
class Phase:
    setup: str  # full | lora | 2x2 | embeddings | vocadt
    steps: int


def phases(strategy: str, total_steps: int, stage1_share: float = STAGE1_SHARE.default) -> list[Phase]:
    """The phases of ``strategy`` over ``total_steps`` optimizer steps."""
    if strategy not in (*STRATEGIES, ADAPTERS):
        raise TrainingError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")
    if strategy not in SECOND_STAGE:
        return [Phase(strategy, total_steps)]
    if not 0.0 < stage1_share < 1.0:
        raise TrainingError(f"--stage1-share must be between 0 and 1 (exclusive); got {stage1_share}.")
    first = max(1, round(total_steps * stage1_share)) if total_steps > 1 else total_steps
    return [Phase("embeddings", first), Phase(SECOND_STAGE[strategy], total_steps - first)]


def decoder_layers(model) -> torch.nn.ModuleList:
    """The model's stack of decoder blocks: the ModuleList with ``num_hidden_layers`` entries."""
    n = getattr(model.config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise TrainingError(f"cannot find the {n} decoder layers of {type(model).__name__}; use --strategy full or lora.")


def embedding_weights(model) -> list[torch.nn.Parameter]:
    """The input embedding and, when untied, the head's weight: the [vocabulary, hidden] matrices."""
    weights = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not weights[0]:
        weights.append(head.weight)
    return weights


def configure(model, setup: str):
    """Set ``requires_grad`` for ``setup`` (and wrap the model with LoRA for ``lora``); returns the model to train."""
    if setup == ADAPTERS:
        from vocgraft.train.vocadt import ADAPTER_PARAM

        names = [name for name, param in model.named_parameters() if name.endswith(ADAPTER_PARAM)]
        if not names:
            raise TrainingError("the vocadt strategy needs a model with vocabulary adapters; use `vocgraft vocadt`.")
        for name, param in model.named_parameters():
            param.requires_grad_(name.endswith(ADAPTER_PARAM))
        return model  # the embedding and head weights are computed from the adapters: nothing else trains
    if setup == "lora":
        model = add_lora(model)
    else:
        for param in model.parameters():
            param.requires_grad_(setup == "full")
        if setup == "2x2":
            layers = decoder_layers(model)
            keep = list(layers[:2]) + list(layers[-2:]) if len(layers) > 4 else list(layers)
            for layer in keep:
                layer.requires_grad_(True)
    for weight in embedding_weights(model):
        weight.requires_grad_(True)
    return model


def add_lora(model):
    """LoRA on every linear layer except the head (r=8, alpha 32, dropout 0.05); base weights frozen."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if isinstance(model, PeftModel):  # phase 2 of a resumed two-stage run: already wrapped
        for name, param in model.named_parameters():
            param.requires_grad_("lora_" in name)
        return model
    return get_peft_model(model, LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM", **LORA))


def base_model(model):
    """The plain transformers model: LoRA merged into its weights when the model is wrapped."""
    from peft import PeftModel

    return model.merge_and_unload() if isinstance(model, PeftModel) else model


def trainable_count(model) -> tuple[int, int]:
    """(trainable, total) parameters; ``parameters()`` yields a tied weight once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
