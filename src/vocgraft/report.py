"""Reports for people: Markdown tables built from the JSON results."""

from __future__ import annotations

import itertools
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


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def markdown_table(
    header: Sequence[str],
    rows: Sequence[Sequence],
    digits: int | Sequence[int] = 3,
    right: Sequence[bool] | None = None,
) -> str:
    """A GitHub-flavoured Markdown table; numbers with ``digits`` decimals (one for every column, or one per
    column), and right-aligned: the columns ``right`` says, by default those with a number in the first row."""
    first = rows[0] if rows else [""] * len(header)
    right = [is_number(v) for v in first] if right is None else right
    align = ["---:" if r else "---" for r in right]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += [
        "| " + " | ".join(fmt(v, digits if isinstance(digits, int) else digits[i]) for i, v in enumerate(row)) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def loss_curve_png(steps: Sequence[dict], val: Sequence[dict], title: str = "") -> bytes:
    """A PNG of the training loss per step (``steps``: dicts with step, loss, clm_loss) and the validation loss at
    its evaluation steps (``val``: dicts with step, loss)."""
    plt = _pyplot()
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
    return _png(fig)


def _png(fig) -> bytes:
    import io

    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    return plt


def speedup_quality_png(
    points: Sequence[dict],
    source_bpb: float,
    tolerance: float,
    xlabel: str = "speedup (source tokens / adapted tokens, held-out text)",
    references: Sequence[tuple[str, float]] | None = None,
) -> bytes:
    """Speedup (x) against bits/byte (y), one line per init method through its k values (labelled), with the
    source's bits/byte and the tolerance band: the recommendation is the right-most point inside the band.
    ``references`` ((label, bits/byte), e.g. the source given the same LAPT): dashed lines, and the band is theirs."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    labelled = set()
    # methods often tie (Mean and Align agree to 3 decimals in expansion): distinct markers and dashes keep a line
    # drawn over another visible
    styles = itertools.cycle([("o", "-", 7), ("s", "--", 10), ("^", ":", 12), ("D", "-.", 8), ("v", "-", 9)])
    for init, (marker, dash, size) in zip(dict.fromkeys(p["init"] for p in points), styles):
        mine = sorted((p for p in points if p["init"] == init), key=lambda p: p["speedup"])
        xs, ys = [p["speedup"] for p in mine], [p["bits_per_byte"] for p in mine]
        ax.plot(xs, ys, marker=marker, ls=dash, ms=size, mfc="none", label=init)
        for p in mine:
            label = f"k={p['new_tokens']}" if p["new_tokens"] is not None else ""
            if p.get("train_sample") is not None:
                label += f" |D|={p['train_sample']}"
            spot = (round(p["speedup"], 3), round(p["bits_per_byte"], 3))
            if label and spot not in labelled:  # one label per position, not one per tying method
                labelled.add(spot)
                ax.annotate(label.strip(), (p["speedup"], p["bits_per_byte"]), textcoords="offset points",
                            xytext=(5, 5), fontsize=7)  # fmt: skip
    ax.axhline(source_bpb, color="black", lw=1, label=f"source ({source_bpb:.3f})")
    bands = references or [("source", source_bpb)]
    for i, (label, bpb) in enumerate(references or []):
        ax.axhline(bpb, color="black", lw=1, ls=(0, (4, 2 + 2 * i)), label=f"{label} ({bpb:.3f})")
    for i, (_, bpb) in enumerate(bands):
        band = f"tolerance: up to +{tolerance:.0%}" + (f" of {bands[0][0]}" if references else "")
        ax.axhspan(bpb, bpb * (1 + tolerance), color="green", alpha=0.12, label=band if i == 0 else None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("bits per UTF-8 byte (lower is better)")
    ax.set_title("Vocabulary adaptation: speed vs quality")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def size_quality_png(points: Sequence[dict], source_bpb: float, references: dict | None = None) -> bytes:
    """Bits/byte against the LAPT corpus size |D| (log2 axis), one line per (init, k); ``references`` (|D| ->
    bits/byte of the source given that LAPT): a line of its own."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for key in dict.fromkeys((p["init"], p["new_tokens"]) for p in points):
        mine = sorted((p for p in points if (p["init"], p["new_tokens"]) == key), key=lambda p: p["train_sample"])
        label = key[0] if key[1] is None else f"{key[0]} k={key[1]}"
        ax.plot([p["train_sample"] for p in mine], [p["bits_per_byte"] for p in mine], "o-", label=label)
    ax.axhline(source_bpb, color="black", lw=1, label=f"source ({source_bpb:.3f})")
    sizes = sorted(size for size in references or {} if size is not None)
    if sizes:
        ax.plot(sizes, [references[size] for size in sizes], "k--", marker="x", label="source + LAPT")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("|D|: LAPT training lines")
    ax.set_ylabel("bits per UTF-8 byte")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)
