"""What `vocgraft expand` checks and says around an expansion: the corpus has letters of ``--scripts``, the held-out
text is in the corpus's scripts, what was added, why nothing was, and the tokens/line the expansion saves on held-out
text.

Problems the user should hear about but that do not stop the work are ``warnings.warn`` (UserWarning), which the
CLI prints as its own one-line warnings: this room never imports the CLI.
"""

from __future__ import annotations

import warnings


def expansion_summary(source_tokenizer, tokenizer, new_ids, lines, rows: int | None = None) -> dict:
    """Tokens/line before and after, speedup proxy, the share of new tokens that the text actually uses, and
    whether the text round-trips exactly (and, given the model's ``rows``, whether every id it uses has a row)."""
    from vocgraft.eval import encode_lines, fertility, speedup
    from vocgraft.eval.fertility import new_tokens_used_share

    before, after = encode_lines(source_tokenizer, lines), encode_lines(tokenizer, lines)
    source, target = fertility(before, lines), fertility(after, lines)
    return {
        "lines": len(lines),
        "tokens_per_line_before": source["tokens_per_line_mean"],
        "tokens_per_line_after": target["tokens_per_line_mean"],
        "speedup": speedup(source["tokens_per_line_mean"], target["tokens_per_line_mean"]),
        "new_tokens_used_share": new_tokens_used_share(after, new_ids),
        "roundtrip_exact": all(tokenizer.decode(ids) == line for ids, line in zip(after, lines)),
    } | ({"ids_have_rows": all(max(ids, default=-1) < rows for ids in after)} if rows is not None else {})


def check_corpus_scripts(scripts, lines: list[str], corpus: str) -> None:
    """``--scripts`` names a script the corpus has letters of (else no token could ever be added)."""
    from vocgraft.recipes.expand import ExpandError
    from vocgraft.tokenization.scripts import describe_shares, script_shares

    if not isinstance(scripts, list):
        return
    shares = script_shares(lines)
    if not any(name in shares for name in scripts):
        raise ExpandError(
            f"--scripts {','.join(scripts)}: the corpus {corpus} has no letters of it (its scripts: "
            f"{describe_shares(shares)}); give the corpus of that language, or --scripts auto."
        )


def check_heldout_scripts(corpus_lines: list[str], heldout_lines: list[str], corpus: str, heldout: str) -> None:
    """Warn when the held-out text is written in other scripts than the corpus: its numbers say nothing about
    the new tokens (an English corpus measured on Greek text, a Greek one on Japanese)."""
    from vocgraft.tokenization.scripts import describe_shares, dominant_scripts, script_shares

    ours, theirs = dominant_scripts(corpus_lines), dominant_scripts(heldout_lines)
    if ours and theirs and not ours & theirs:
        warnings.warn(
            f"--heldout {heldout} is in {describe_shares(script_shares(heldout_lines))} but --corpus {corpus} is "
            f"in {describe_shares(script_shares(corpus_lines))}: the held-out numbers cannot show what the new "
            "tokens do; give held-out text of the corpus's language.",
            UserWarning,
            stacklevel=2,
        )


def explain_zero_tokens(added: dict) -> str:
    """Why an expansion added nothing, from what it skipped."""
    from vocgraft.tokenization.expand import SKIP_REASONS

    if not added["skipped_reasons"]:
        return (
            "every token of the auxiliary tokenizer that occurs in the corpus is already in the source vocabulary; "
            "train it on target-language text with a larger --aux-vocab-size, or drop --aux-tokenizer"
        )
    reasons = "; ".join(f"{n} because {SKIP_REASONS[key]}" for key, n in added["skipped_reasons"].items())
    return f"every candidate was skipped ({reasons})"


def recipe_warnings(messages: list[str], result) -> list[str]:
    """The recipe's warnings, one line each, as `vocgraft expand` shows them; with nothing added, "only 0 of ..."
    is left out: :func:`zero_tokens_warning` says why."""
    nothing = result.expansion.to_dict()["added"] == 0
    return [" ".join(m.split()) for m in messages if not (nothing and m.startswith("only 0 of"))]


def describe_expansion(result, init: str, out) -> str:
    """What was added (tokens, intermediates, the scripts wanted) and which candidates were skipped, and why."""
    added = result.expansion.to_dict()
    scripts = ", ".join(result.scripts) if result.scripts else "any script"
    text = (
        f"added {added['added']} tokens ({added['intermediate_count']} intermediates; wanted tokens in {scripts}) "
        f"with init={init} -> {out}"
    )
    if added["skipped_reasons"]:
        text += "\ncandidates skipped: " + ", ".join(f"{n} {key}" for key, n in added["skipped_reasons"].items())
    return text


def zero_tokens_warning(result, out) -> str | None:
    """When nothing was added: that ``out`` tokenizes as the source does, and why (:func:`explain_zero_tokens`)."""
    added = result.expansion.to_dict()
    if added["added"] != 0:
        return None
    return f"0 new tokens were added, so {out} tokenizes as the source does: {explain_zero_tokens(added)}."


def heldout_report(model_spec: str, result, heldout: list[str], heldout_path: str) -> tuple[dict, str | None]:
    """:func:`expansion_summary` of the expanded model on the held-out lines, and a warning when new tokens were
    added but none of them occurs there."""
    from vocgraft.models import load_tokenizer

    summary = expansion_summary(
        load_tokenizer(model_spec),
        result.tokenizer,
        result.plan.new_ids,
        heldout,
        rows=result.model.get_input_embeddings().weight.shape[0],
    )
    added = result.expansion.to_dict()["added"]
    if not added or summary["new_tokens_used_share"] != 0:
        return summary, None
    return summary, (
        f"none of the {added} new tokens occurs in --heldout {heldout_path}: it is not text of the corpus's "
        "language, or the corpus is too small to have found its frequent words."
    )
