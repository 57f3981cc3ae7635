"""Expansions of the real SentencePiece families (../shared/tokenizers: Llama-2, Phi-3, Gemma) join what SentencePiece,
and so llama.cpp, joins: every split of every entry into two entries is a merge, ranked with that entry's merges;
the source's merges keep their order; English and every source entry tokenize as before; and llama.cpp's
SentencePiece algorithm (tests/llama_cpp_spm.py) over the scores export writes gives the expanded tokenizer's ids.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest
from llama_cpp_spm import SpmTokenizer
from tiny import lines
from transformers import AutoTokenizer

from vocgraft.corpus import read_lines
from vocgraft.export import sentencepiece as sp
from vocgraft.export.mismatch import chunks
from vocgraft.families import FAMILIES, LARGE, SHARED_TOKENIZERS
from vocgraft.tokenization import expand_tokenizer, parse_merges, train_tokenizer
from vocgraft.tokenization.expand import SENTENCEPIECE, bpe_family
from vocgraft.tokenization.sp_bpe import SentencePieceBPE

K = 150


def _spec(tokenizer) -> dict:
    return json.loads(tokenizer.backend_tokenizer.to_str())


def _is_sentencepiece(family: str) -> bool:
    spec = json.loads((SHARED_TOKENIZERS / family / "tokenizer.json").read_text(encoding="utf-8"))
    return bpe_family(spec) == SENTENCEPIECE


SP_FAMILIES = [f for f in FAMILIES if _is_sentencepiece(f)]


class Expanded:
    def __init__(self, family: str):
        self.source = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / family)
        train = lines("el", 800)
        aux = train_tokenizer(train, "sp-bpe", 1500, like=self.source)
        self.ex = expand_tokenizer(self.source, aux, train, K, scripts={"GREEK"})
        self.before, self.after = _spec(self.source), _spec(self.ex.tokenizer)
        skipped = sp.skipped_pieces(self.after)
        self.usable = {t for t in self.after["model"]["vocab"] if t not in skipped}


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.large_vocab) if f in LARGE else f
                                        for f in SP_FAMILIES])  # fmt: skip
def expanded(request) -> Expanded:
    return Expanded(request.param)


def test_the_catalog_has_the_sentencepiece_families():
    assert {"llama2", "phi3", "gemma4"} <= set(SP_FAMILIES)


def test_every_split_of_every_entry_is_a_merge(expanded):
    usable = expanded.usable
    merges = set(parse_merges(expanded.after["model"]["merges"]))
    missing = [
        (t[:i], t[i:])
        for t in usable
        for i in range(1, len(t))
        if t[:i] in usable and t[i:] in usable and (t[:i], t[i:]) not in merges
    ]
    assert not missing, missing[:5]
    assert expanded.ex.new_tokens and sp.merge_differences(expanded.after) is None


def test_source_merges_keep_their_order_and_new_ones_rank_with_their_entry(expanded):
    old = parse_merges(expanded.before["model"]["merges"])
    new = parse_merges(expanded.after["model"]["merges"])
    added = set(new) - set(old)
    assert [m for m in new if m not in added] == old and len(added) == len(expanded.ex.merges) == len(new) - len(old)
    new_tokens = set(expanded.ex.new_tokens)
    # a split completing an old entry (Gemma has many, Llama-2 few Greek entries) directly follows a merge of that
    # entry: its score is unchanged
    completing = [i for i, m in enumerate(new) if m in added and "".join(m) not in new_tokens]
    assert all("".join(new[i - 1]) == "".join(new[i]) for i in completing)
    # a new entry's merges stand together, after every old merge: its score is below every old entry's
    where = defaultdict(list)
    for i, m in enumerate(new):
        if "".join(m) in new_tokens:
            where["".join(m)].append(i)
    last_old = max(i for i, m in enumerate(new) if m not in added)
    assert all(at == list(range(at[0], at[0] + len(at))) and at[0] > last_old for at in where.values())
    assert [t for t in sorted(where, key=lambda t: where[t][0])] == [t for t in expanded.ex.new_tokens if t in where]


def test_english_and_every_source_entry_tokenize_as_before(expanded):
    english = read_lines(SHARED_TOKENIZERS.parent / "corpora" / "en" / "heldout.txt", limit=300)
    assert expanded.source(english).input_ids == expanded.ex.tokenizer(english).input_ids
    before, after = expanded.source.backend_tokenizer.model, expanded.ex.tokenizer.backend_tokenizer.model
    for token in expanded.before["model"]["vocab"]:
        assert [t.id for t in after.tokenize(token)] == [t.id for t in before.tokenize(token)], token


def _llama_cpp(spec: dict) -> SpmTokenizer:
    """llama.cpp's tokenizer over the token list and scores export writes (vocgraft.export.tokenizer.vocabulary)."""
    vocab = dict(spec["model"]["vocab"]) | {t["content"]: t["id"] for t in spec["added_tokens"]}
    rows = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(rows)]
    for token, i in vocab.items():
        tokens[i] = token
    prefix, _ = sp.space_prefix(spec)
    return SpmTokenizer(tokens, sp.token_scores(spec["model"]["vocab"], sp.merge_pairs(spec["model"]), rows), prefix)


def test_llama_cpps_rule_gives_the_expanded_ids(expanded):
    engine = _llama_cpp(expanded.after)
    greek = read_lines(SHARED_TOKENIZERS.parent / "corpora" / "el" / "heldout.txt", limit=200)
    english = read_lines(SHARED_TOKENIZERS.parent / "corpora" / "en" / "heldout.txt", limit=100)
    # text that puts new entries and the pieces they split into side by side, in every order
    rng = random.Random(0)
    usable, new = expanded.usable, expanded.ex.new_tokens
    splits = {p for t in new for i in range(1, len(t)) for p in (t[:i], t[i:]) if t[:i] in usable and t[i:] in usable}
    parts = sorted(splits | set(new))
    mixed = ["".join(rng.choices(parts, k=rng.randint(2, 6))).replace(sp.SPACE, " ").lstrip() for _ in range(500)]
    text = [t for t in greek + chunks(greek) + english + mixed if t]  # Llama-2's Metaspace: no leading space
    ours = expanded.ex.tokenizer(text, add_special_tokens=False).input_ids
    differing = [line for line, ids in zip(text, ours) if engine(line) != ids]
    assert not differing, differing[:3]


# ------------------------------------------------------------------------------------------- the engine


def test_a_new_entry_completes_old_ones_ranked_with_their_merges_and_rolls_back():
    vocab = ["▁", "ν", "α", "ι", "▁ν", "▁να", "αι", "<0x41>"]
    merges = [("▁", "ν"), ("▁ν", "α"), ("α", "ι")]
    engine = SentencePieceBPE(vocab, merges, unmergeable={"<0x41>"})
    assert engine.tokenize("▁ναι") == ["▁να", "ι"]
    mark = engine.checkpoint()
    engine.add_token("να")  # its own split (ν, α) after every merge; (▁, να) completes ▁να, after ▁να's merges
    assert engine.merges_since(mark) == [(1 + 1 / 65536, ("▁", "να")), (3, ("ν", "α"))]
    assert engine.tokenize("▁να") == ["▁να"] and engine.tokenize("να") == ["να"]
    engine.add_token("ναι")  # splits (να, ι) and (ν, αι), ranked together
    assert engine.merges_since(mark)[-2:] == [(4, ("ν", "αι")), (5, ("να", "ι"))]
    assert ("▁να", "ι") not in engine.ranks  # ▁ναι is no entry
    engine.add_token("▁ναι")
    assert engine.merges_since(mark)[-3:] == [(6, ("▁", "ναι")), (7, ("▁ν", "αι")), (8, ("▁να", "ι"))]
    assert engine.tokenize("▁ναι") == ["▁ναι"]
    engine.rollback(mark)
    assert engine.vocab == set(vocab) and engine.ranks == {m: i for i, m in enumerate(merges)}
    assert engine.merges_since(mark) == [] and engine.tokenize("▁ναι") == ["▁να", "ι"]
    engine.add_token("να")  # the same ranks again after the undo
    assert engine.merges_since(mark) == [(1 + 1 / 65536, ("▁", "να")), (3, ("ν", "α"))]
