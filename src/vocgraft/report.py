"""Reports for people: Markdown tables built from the JSON results."""

from __future__ import annotations

from collections.abc import Sequence


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table; numbers right-aligned."""
    first = rows[0] if rows else [""] * len(header)
    align = ["---:" if isinstance(v, (int, float)) and not isinstance(v, bool) else "---" for v in first]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(fmt(v, digits) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def eval_markdown(result: dict, name: str = "model") -> str:
    """The `vocgraft eval` result as a two-column table (metric, value)."""
    tok = result["tokenizer"]
    rows = [
        ["lines", tok["lines"]],
        ["tokens / line (mean)", tok["tokens_per_line_mean"]],
        ["tokens / line (median)", float(tok["tokens_per_line_median"])],
        ["characters / token", tok["chars_per_token"]],
        ["UTF-8 bytes / token", tok["bytes_per_token"]],
    ]
    if "speedup" in result:
        rows += [
            ["baseline tokens / line (mean)", result["baseline_tokenizer"]["tokens_per_line_mean"]],
            ["speedup proxy (baseline ÷ model tokens)", result["speedup"]],
        ]
    if "bpb" in result:
        bpb = result["bpb"]
        rows += [
            ["bits / byte", bpb["bits_per_byte"]],
            ["uniform reference bits / byte", bpb["uniform_bits_per_byte"]],
            ["perplexity (per token)", bpb["perplexity"]],
            ["tokens scored", bpb["tokens_scored"]],
            ["eval throughput (tokens/s)", bpb["forward_tokens_per_second"]],
        ]
    return markdown_table(["metric", name], rows)


def loss_curve_png(steps: Sequence[dict], val: Sequence[dict], title: str = "") -> bytes:
    """A PNG of the training loss per step (``steps``: dicts with step, loss, clm_loss) and the validation loss at
    its evaluation steps (``val``: dicts with step, loss)."""
    import io

    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if steps:
        x = [s["step"] for s in steps]
        ax.plot(x, [s["clm_loss"] for s in steps], lw=1, alpha=0.8, label="training loss (CLM)")
        if any(s["loss"] != s["clm_loss"] for s in steps):  # MTP: the optimized total, for reference
            ax.plot(x, [s["loss"] for s in steps], lw=1, ls="--", alpha=0.6, label="training loss (CLM + MTP)")
    if val:
        ax.plot([v["step"] for v in val], [v["loss"] for v in val], "o-", label="validation loss (CLM)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
