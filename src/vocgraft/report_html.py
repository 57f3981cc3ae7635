"""``report.html``: the sweep report as one self-contained page (inline CSS, plots as data URIs) with a token view.

The token view shows held-out lines as the source and the adapted tokenizer cut them, token by token, with the
tokens the source vocabulary does not have highlighted: what a reader of the numbers wants to see with their own
eyes. Every text from outside (corpus lines, tokens, settings) is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vocgraft.report import fmt, is_number

VIEW_LINES = 5  # held-out lines in the token view
VIEW_CHARS = (20, 240)  # ... of a readable length: no one-word lines, no paragraphs


@dataclass
class Segment:
    """A stretch of the line and the tokens that spell it: one token, or several when a token holds only part of
    a character's bytes (byte-level BPE cuts some characters in two)."""

    text: str
    tokens: int
    new: bool


def segments(tokenizer, text: str, is_new: Callable[[int], bool]) -> tuple[list[Segment], int]:
    """``text`` cut where ``tokenizer`` cuts it, and its number of tokens (no special tokens added).

    Each token's text is the growth of the decoded prefix, so leading spaces, SentencePiece's ``▁`` and byte
    pieces show as the reader sees them; a prefix that ends in an incomplete character waits for the next token."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    out: list[Segment] = []
    shown, pending = "", []
    for i, token in enumerate(ids):
        pending.append(token)
        prefix = tokenizer.decode(ids[: i + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if prefix.endswith("\ufffd") and not text.startswith(prefix) and i + 1 < len(ids):
            continue
        out.append(Segment(prefix[len(shown) :], len(pending), any(is_new(t) for t in pending)))
        shown, pending = prefix, []
    return out, len(ids)


def new_token_test(source, adapted) -> Callable[[int], bool]:
    """Whether an adapted id is a token the source vocabulary does not have (by its string: expansion appends
    such tokens, replacement mixes them with kept ones)."""
    known = set(source.get_vocab())
    return lambda token: adapted.convert_ids_to_tokens(token) not in known


def pick_lines(lines: Sequence[str], count: int = VIEW_LINES) -> list[str]:
    shortest, longest = VIEW_CHARS
    fitting = [line for line in lines if shortest <= len(line) <= longest]
    return (fitting or list(lines))[:count]


def token_view(source, adapted, lines: Sequence[str]) -> list[dict]:
    """For each line: its source and adapted segments and token counts."""
    is_new = new_token_test(source, adapted)
    view = []
    for line in lines:
        before, before_count = segments(source, line, lambda _: False)
        after, after_count = segments(adapted, line, is_new)
        view.append({"text": line, "source": (before, before_count), "adapted": (after, after_count)})
    return view


# --------------------------------------------------------------------------------------------------- the page

CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #1d232a; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #d0d7de; }
.verdict { background: #eaf6ec; border-left: 5px solid #2c974b; padding: .7em 1em; font-size: 1.05em; }
.verdict.miss { background: #fff4e5; border-left-color: #d4760b; }
table.results { border-collapse: collapse; font-size: .9em; }
table.results th, table.results td { border: 1px solid #d0d7de; padding: .3em .6em; }
table.results th { background: #f3f5f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { background: #eaf6ec; font-weight: 600; }
img { max-width: 100%; border: 1px solid #d0d7de; }
.line { margin: 1.2em 0; } .line .label { color: #57606a; font-size: .85em; margin: .2em 0; }
.tokens { white-space: pre-wrap; word-break: break-word; line-height: 2.1; }
.tok { padding: .15em 1px; border-radius: 3px; margin-right: 1px; background: #dde3ea; }
.tok:nth-child(even) { background: #c8d1db; }
.tok.new { background: #ffd8a8; box-shadow: inset 0 -3px 0 #e8590c; }
.tok.new:nth-child(even) { background: #ffc078; }
.legend .tok { margin: 0 .3em; } .count { font-variant-numeric: tabular-nums; color: #57606a; }
.small { color: #57606a; font-size: .85em; }
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _table(header: Sequence[str], rows: Sequence[Sequence], best: int | None, digits: Sequence[int] | None) -> str:
    """``digits``: each column's decimals (default 3)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f'<td class="num">{_e(fmt(v, digits[c] if digits else 3))}</td>'
            if is_number(v)
            else f"<td>{_e(fmt(v))}</td>"
            for c, v in enumerate(row)
        )
        body.append(f'<tr class="best">{cells}</tr>' if i == best else f"<tr>{cells}</tr>")
    return f'<table class="results"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _tokens(parts: list[Segment]) -> str:
    spans = []
    for part in parts:
        title = f"{part.tokens} tokens" if part.tokens > 1 else ""
        text = _e(part.text).replace("\n", "↵\n")
        cls = "tok new" if part.new else "tok"
        spans.append(f'<span class="{cls}"' + (f' title="{_e(title)}"' if title else "") + f">{text}</span>")
    return "".join(spans)


def _view(view: list[dict], source_name: str, adapted_name: str) -> str:
    if not view:
        return '<p class="small">No held-out lines to show.</p>'
    blocks = []
    total_before = sum(v["source"][1] for v in view)
    total_after = sum(v["adapted"][1] for v in view)
    for number, item in enumerate(view, 1):
        (before, n_before), (after, n_after) = item["source"], item["adapted"]
        new = sum(s.tokens for s in after if s.new)
        blocks.append(
            f'<div class="line"><div class="label">line {number}</div>'
            f'<div class="label">source ({_e(source_name)}): <span class="count">{n_before} tokens</span></div>'
            f'<div class="tokens source">{_tokens(before)}</div>'
            f'<div class="label">adapted ({_e(adapted_name)}): <span class="count">{n_after} tokens, {new} new'
            f"</span></div>"
            f'<div class="tokens adapted">{_tokens(after)}</div></div>'
        )
    ratio = total_before / total_after if total_after else float("nan")
    summary = (
        f'<p class="count">tokens/line on these {len(view)} lines: source {total_before / len(view):.1f}, adapted '
        f"{total_after / len(view):.1f}: speedup {ratio:.2f}x</p>"
    )
    legend = (
        '<p class="legend small">Each box is one token (neighbours alternate in shade); '
        '<span class="tok new">orange</span> tokens are not in the source vocabulary. Counts are without special '
        "tokens; a box holding part of a character's bytes is merged with the next one.</p>"
    )
    return legend + summary + "".join(blocks)


def render(
    *,
    title: str,
    verdict: str,
    within: bool,
    intro: str,
    header: Sequence[str],
    rows: Sequence[Sequence],
    best: int | None,
    images: dict[str, bytes],
    view: list[dict],
    source_name: str,
    adapted_name: str,
    digits: Sequence[int] | None = None,
    advice: str | None = None,
) -> str:
    """The page as a string; every argument's text is escaped here. ``advice``: markdown paragraphs (an indented
    one is a command), shown before the sweep's own recommendation."""
    figures = "".join(
        f'<figure><img alt="{_e(caption)}" src="{_data_uri(png)}"><figcaption class="small">{_e(caption)}'
        "</figcaption></figure>"
        for caption, png in images.items()
    )
    verdict_class = "verdict" if within else "verdict miss"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f"{_advice(advice)}"
        f'<p class="{verdict_class}" id="recommendation">{_e(verdict)}</p>'
        f'<p class="small">{_e(intro)}</p>'
        f"<h2>Results</h2>{_table(header, rows, best, digits)}"
        f"<h2>Plots</h2>{figures}"
        f'<h2 id="token-view">Token view</h2>{_view(view, source_name, adapted_name)}'
        "</body></html>\n"
    )


def _advice(advice: str | None) -> str:
    if not advice:
        return ""
    blocks = (
        f"<pre>{_e(block.strip())}</pre>" if block.startswith("    ") else f"<p>{_e(block.replace('**', ''))}</p>"
        for block in advice.split("\n\n")
    )
    return f'<div class="verdict" id="advice">{"".join(blocks)}</div>'


def write_html(path: str | Path, page: str) -> Path:
    """Write ``page`` atomically: a reader never opens half a report."""
    from vocgraft.outdir import atomic_write

    return atomic_write(path, page)


def write_sweep_html(
    out: Path,
    sweep: dict,
    *,
    title: str,
    verdict: str,
    intro: str,
    header,
    rows,
    digits: Sequence[int] | None = None,
    advice: str | None = None,
) -> Path:
    """``<out>/report.html`` for a sweep whose report.md was just written (plots read from ``out``); the token
    view shows the recommended setting's tokenizer against the source's on held-out lines."""
    from vocgraft.corpus import read_lines
    from vocgraft.eval.registry import BITS_PER_BYTE, SPEEDUP
    from vocgraft.models import load_tokenizer

    config, points, rec = sweep["config"], sweep["points"], sweep["recommendation"]
    best = rec["point"]
    source = load_tokenizer(config["model"])
    adapted = load_tokenizer(best["model_dir"])
    lines = pick_lines(read_lines(config["heldout"], limit=max(config["eval"]["limit"] or 0, 200)))
    captions = {
        "speedup_vs_bpb.png": f"{SPEEDUP.label} vs {BITS_PER_BYTE.label}",
        "bpb_vs_size.png": f"{BITS_PER_BYTE.label} vs |D|",
    }
    sized = any(p.get("train_sample") is not None for p in points)
    images = {
        caption: (out / name).read_bytes()
        for name, caption in captions.items()
        if name == "speedup_vs_bpb.png" or sized
    }
    page = render(
        title=title,
        verdict=verdict.replace("**", ""),
        within=rec["within_tolerance"],
        intro=intro,
        header=header,
        rows=rows,
        best=next((i for i, p in enumerate(points) if p == best), None),  # equal after a JSON round trip too
        images=images,
        digits=digits,
        view=token_view(source, adapted, lines),
        source_name=f"{config['model']}, {len(source):,} tokens",
        adapted_name=f"{_setting(best)}, {len(adapted):,} tokens",
        advice=advice,
    )
    return write_html(out / "report.html", page)


def _setting(point: dict) -> str:
    parts = [f"k={point['new_tokens']}"] if point["new_tokens"] is not None else [point.get("mode", "")]
    parts.append(f"init={point['init']}")
    if point.get("train_sample") is not None:
        parts.append(f"|D|={point['train_sample']}")
    return ", ".join(p for p in parts if p)
