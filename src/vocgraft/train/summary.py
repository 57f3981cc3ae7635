"""A training run's summary (what :func:`vocgraft.train.lapt.train` returns) in words: the paragraph `vocgraft train`
and `vocgraft vocadt` print when the run ends."""

from __future__ import annotations


def describe_run(summary: dict, out: str) -> str:
    """Steps, epochs, recipe, warmup, speed, validation loss and peak memory of the run that saved ``out``; or, for
    ``--resume`` on a run whose model was already saved, that nothing was trained."""
    if summary.get("finished_before"):  # --resume on a run whose model was already saved: nothing trained
        removed = summary.get("removed_checkpoints")
        cleaned = f"; removed its leftover checkpoints {removed}" if removed else ""
        return f"this run is finished (model at {out}){cleaned}"
    resumed = f"resumed from step {summary['resumed_from_step']}\n" if summary["resumed_from_step"] is not None else ""
    recipe = f"recipe {summary['recipe']}, " if summary.get("recipe") else ""
    group = summary.get("new_rows")
    rows = f", {group['rows']} new rows at {group['lr_scale']:g} x lr" if group else ""
    return (
        f"{resumed}{summary['strategy']}/{summary['objective']}: {summary['steps']} steps "
        f"({summary['epochs']} epochs of {summary['train_sequences']} sequences of {summary['seq_len']} tokens, "
        f"{recipe}{summary['warmup_steps']} warmup, lines joined by {summary['join']}{rows}), "
        f"{summary['tokens_per_second']:.0f} tokens/s, validation loss {summary['val_loss_start']:.3f} -> "
        f"{summary['val_loss_end']:.3f}, peak RSS {summary['peak_rss_mib']:.0f} MiB -> {out}"
    )
