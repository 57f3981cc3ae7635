"""report.html from a tiny report built in memory (no model): its structure, the token view, the escaping."""

from __future__ import annotations

import base64
import html
from html.parser import HTMLParser

import pytest
from tiny import lines, tiny_bytelevel_tokenizer, tiny_sp_tokenizer

from vocgraft.report import speedup_quality_png
from vocgraft.report_html import render, segments, token_view

HOSTILE = "<script>alert('x')</script> & \"quoted\""


class Page(HTMLParser):
    """Every start tag with its attributes, and the text inside each element with a class, by class."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text_by_class: dict[str, list[str]] = {}
        self._open: list[str | None] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag not in ("img", "meta", "br"):
            self._open.append(attrs.get("class"))

    def handle_endtag(self, tag):
        if tag not in ("img", "meta", "br"):
            self._open.pop()

    def handle_data(self, data):
        if self._open and self._open[-1]:
            self.text_by_class.setdefault(self._open[-1], []).append(data)

    def find(self, tag: str, **attrs) -> list[dict]:
        return [a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())]


@pytest.fixture(scope="module")
def tokenizers():
    english, greek = lines("en", 300), lines("el", 300)
    source = tiny_bytelevel_tokenizer(400, text=english)
    adapted = tiny_bytelevel_tokenizer(900, text=english + greek)  # a different vocabulary: many new tokens
    return source, adapted


@pytest.fixture(scope="module")
def page(tokenizers):
    source, adapted = tokenizers
    shown = [*lines("el", 400)[-2:], "x < y && z > 0 " + HOSTILE]
    points = [
        {"init": "mean", "new_tokens": 10, "speedup": 1.3, "bits_per_byte": 2.1},
        {"init": HOSTILE, "new_tokens": 20, "speedup": 1.5, "bits_per_byte": 2.2},
    ]
    text = render(
        title=f"vocgraft sweep: {HOSTILE}",
        verdict=f"Recommendation: k=20, init={HOSTILE}",
        within=True,
        intro=f"Source: 3.0 tokens/line on {HOSTILE}",
        header=["k", "init", "speedup", "bits/byte", HOSTILE],
        rows=[[p["new_tokens"], p["init"], p["speedup"], p["bits_per_byte"], HOSTILE] for p in points],
        best=1,
        images={f"speedup vs bits/byte {HOSTILE}": speedup_quality_png(points, 2.0, 0.02)},
        view=token_view(source, adapted, shown),
        source_name=f"source {HOSTILE}",
        adapted_name=f"adapted {HOSTILE}",
    )
    return text, shown


def test_the_page_has_the_table_the_recommendation_and_embedded_plots(page):
    text, _ = page
    parsed = Page(text)
    assert text.startswith("<!DOCTYPE html>") and len(parsed.find("style")) == 1  # the CSS is inline
    assert [t for t, _ in parsed.tags].count("th") == 5 and [t for t, _ in parsed.tags].count("td") == 10
    assert len(parsed.find("tr", **{"class": "best"})) == 1
    assert "".join(parsed.text_by_class["verdict"]) == f"Recommendation: k=20, init={HOSTILE}"
    assert "1.300" in parsed.text_by_class["num"] and "2.200" in parsed.text_by_class["num"]
    images = parsed.find("img")
    assert len(images) == 1
    prefix = "data:image/png;base64,"
    assert images[0]["src"].startswith(prefix)
    assert base64.b64decode(images[0]["src"][len(prefix) :])[:8] == b"\x89PNG\r\n\x1a\n"
    # self-contained: nothing is fetched from elsewhere
    assert not parsed.find("link") and not parsed.find("script")
    assert all(a.get("src", "data:").split(":")[0] not in ("http", "https", "file") for _, a in parsed.tags)


def test_every_outside_text_is_escaped(page):
    text, _ = page
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "&quot;quoted&quot;" in text or "&#x27;" in text
    assert not Page(text).find("script")


def test_the_token_view_shows_each_line_cut_by_both_tokenizers_with_new_tokens_marked(page, tokenizers):
    text, shown = page
    source, adapted = tokenizers
    parsed = Page(text)
    source_blocks = text.split('<div class="tokens source">')[1:]
    adapted_blocks = text.split('<div class="tokens adapted">')[1:]
    assert len(source_blocks) == len(adapted_blocks) == len(shown)
    for line, before, after in zip(shown, source_blocks, adapted_blocks):
        before, after = before.split("</div>")[0], after.split("</div>")[0]
        # the boxes spell the line exactly, once escaping is undone
        assert html.unescape(_strip_tags(before)) == line and html.unescape(_strip_tags(after)) == line
        assert 'class="tok new"' not in before  # the source has no new tokens by definition
        n_source = len(source.encode(line, add_special_tokens=False))
        n_adapted = len(adapted.encode(line, add_special_tokens=False))
        assert f"{n_source} tokens" in text and f"{n_adapted} tokens" in text
    greek_after = adapted_blocks[0].split("</div>")[0]
    assert greek_after.count('class="tok new"') >= 3  # Greek words the source vocabulary did not have
    assert len(parsed.find("span", **{"class": "tok new"})) >= 3


def _strip_tags(fragment: str) -> str:
    out, inside = [], False
    for char in fragment:
        if char == "<":
            inside = True
        elif char == ">":
            inside = False
        elif not inside:
            out.append(char)
    return "".join(out)


@pytest.mark.parametrize("make", [tiny_bytelevel_tokenizer, tiny_sp_tokenizer])
def test_segments_spell_the_line_and_keep_split_characters_whole(make):
    tokenizer = make()
    for line in lines("el", 5) + ["Hello, world: 42 ≥ 41!"]:
        parts, count = segments(tokenizer, line, lambda _: False)
        assert "".join(p.text for p in parts) == line
        assert sum(p.tokens for p in parts) == count == len(tokenizer.encode(line, add_special_tokens=False))
        assert all("\ufffd" not in p.text for p in parts)
    # the byte-level tokenizer learned English only: a Greek letter is two byte tokens, shown as one box
    if make is tiny_bytelevel_tokenizer:
        parts, _ = segments(tokenizer, "Ω", lambda _: False)
        assert [(p.text, p.tokens) for p in parts] == [("Ω", 2)]
