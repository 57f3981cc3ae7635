"""Writing systems of text and tokens: what keeps an expansion to the target language's script."""

from __future__ import annotations

from vocgraft.tokenization.scripts import char_script, dominant_scripts, in_scripts


def test_char_script_names_letters_and_marks_only():
    assert char_script("λ") == "GREEK"
    assert char_script("ि") == "DEVANAGARI"  # a vowel sign (a mark) belongs to its script
    assert char_script("a") == "LATIN"
    assert char_script("漢") == "CJK"
    assert [char_script(c) for c in "7 ,।"] == [None, None, None, None]


def test_dominant_scripts_keep_the_language_and_drop_embedded_english():
    hindi = ["यह हिन्दी का वाक्य है और इसमें SMTP भी है"] * 10
    assert dominant_scripts(hindi) == {"DEVANAGARI"}
    japanese = ["日本語の漢字とカタカナのテスト"] * 3
    assert dominant_scripts(japanese) == {"HIRAGANA", "KATAKANA", "CJK"}
    assert dominant_scripts([]) == set()
    # only the first max_lines lines are read
    assert dominant_scripts(["abc"] + ["αβγ"] * 5, max_lines=1) == {"LATIN"}


def test_in_scripts_on_canonical_bytes():
    greek = {"GREEK"}
    assert in_scripts(" λόγος".encode(), greek)
    assert not in_scripts(b" LibreOffice", greek)
    assert not in_scripts(b"2019", greek)  # digits and punctuation have no script
    assert not in_scripts(b").\n", greek)
    assert in_scripts("λ".encode()[:1], greek)  # a piece of a multi-byte character is a step towards one
    assert in_scripts(" Ωmega".encode(), greek)  # mixed tokens pass on any wanted letter
