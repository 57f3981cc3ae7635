"""Generation health counters on hand-made text, and fixed-length interleaved generation speed on tiny models."""

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama, tiny_sp_tokenizer

from vocgraft.eval.fertility import tokens_per_byte
from vocgraft.eval.generation import GREEDY, generate_one, prompts_from_lines
from vocgraft.eval.health import generation_health, greedy_generations, repeated_ngrams, text_health
from vocgraft.eval.speed import (
    Sample,
    continuation_text,
    fixed_length_speeds,
    interleave,
    speed_summary,
    stop_ids,
    text_independent_speedup,
)

# ------------------------------------------------------------------------------------------------ health


def test_repeated_ngrams_by_hand():
    # n-grams: abc, bca, cab, abc -> only the 4th was seen before
    assert repeated_ngrams("abcabc", 3) == (1, 4)
    assert repeated_ngrams("aaaa", 2) == (2, 3)
    assert repeated_ngrams("ab", 3) == (0, 0)
    assert repeated_ngrams([1, 2, 1, 2, 1], 2) == (2, 4)
    with pytest.raises(ValueError):
        repeated_ngrams("abc", 0)


def test_text_health_catches_loops_and_broken_utf8():
    loop = "οχόλια, " * 10
    normal = "Καθορίστε το κείμενο ετικέτας και επιλέξτε το μέγεθος χαρτιού."
    broken = "Καλη\ufffd\ufffd"
    health = text_health([loop, normal, broken, " "])
    assert health["generations"] == 4
    assert health["mean_chars"] == pytest.approx((80 + len(normal) + 6 + 1) / 4)
    assert health["empty_share"] == 0.25
    assert health["replacement_char_share"] == pytest.approx(2 / (80 + len(normal) + 6 + 1))
    assert health["with_replacement_char"] == 0.25
    # the loop: 73 8-grams, all but the first 8 repeat; the sentence has none; the others have fewer than 8 chars
    assert health["repeated_char_ngram_share"] == pytest.approx(65 / (73 + len(normal) - 7))
    assert text_health([normal])["repeated_char_ngram_share"] == 0.0
    assert text_health([loop])["repeated_char_ngram_share"] > 0.85
    with pytest.raises(ValueError, match="no generations"):
        text_health([])


def test_generation_health_counts_stops_and_tokens():
    tok = tiny_bytelevel_tokenizer()
    eos = tok.eos_token_id
    text = tok("the file is open", add_special_tokens=False).input_ids
    generations = [[*text, eos], text, [*text[:2], eos], []]
    health = generation_health(tok, generations, max_new_tokens=len(text))
    assert health["eos_stop_rate"] == 0.5
    assert health["mean_new_tokens"] == (2 * len(text) + 2) / 4
    assert health["mean_chars"] == pytest.approx((2 * len("the file is open") + len(tok.decode(text[:2]))) / 4)
    assert health["repeated_token_ngram_share"] == 0.0
    looping = generation_health(tok, [text * 5], max_new_tokens=100, stop_ids={eos})
    assert looping["eos_stop_rate"] == 0.0 and looping["repeated_token_ngram_share"] > 0.7
    with pytest.raises(ValueError, match="texts"):
        generation_health(tok, generations, max_new_tokens=5, texts=["a"])


# ------------------------------------------------------------------------------------------------ speed


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_bytelevel_tokenizer()


def eos_loving(tokenizer, seed=0):
    """A tiny model whose head makes EOS the most likely next token everywhere, by a wide margin."""
    model = tiny_llama(len(tokenizer), tied=False, seed=seed)
    eos = tokenizer.eos_token_id
    model.lm_head.register_forward_hook(lambda module, args, out: out.index_add(
        -1, torch.tensor([eos]), torch.full((*out.shape[:-1], 1), 1e4)))  # fmt: skip
    return model


def test_fixed_length_generation_never_stops_even_when_eos_is_the_argmax(tokenizer):
    model = eos_loving(tokenizer)
    prompts = prompts_from_lines(lines("en", 4), chars=30)
    free = generate_one(model, tokenizer, prompts[0], 6, GREEDY)
    assert free == [tokenizer.eos_token_id]  # left alone, it stops at once
    assert generation_health(tokenizer, [free], max_new_tokens=6)["eos_stop_rate"] == 1.0
    result = fixed_length_speeds({"eos": (model, tokenizer)}, prompts, new_tokens=6, warmup=0)
    own = result["models"]["eos"]
    assert own["generated_tokens"] == 6 * len(prompts) and own["short_generations"] == 0
    assert all(len(p["new_ids"]) == 6 and tokenizer.eos_token_id not in p["new_ids"] for p in own["per_prompt"])
    assert own["chars"] == sum(len(t) for t in own["texts"]) > 0
    assert own["chars_per_token"] == pytest.approx(own["chars"] / own["generated_tokens"])
    assert own["first_token_seconds_mean"] > 0 and own["decode_seconds_per_step"] > 0
    assert own["seconds"] == pytest.approx(sum(p["seconds"] for p in own["per_prompt"]))
    assert own["chars_per_second_ratio"]["estimate"] == 1.0  # the baseline against itself


def test_stop_ids_include_the_models_generation_config(tokenizer):
    model = tiny_llama(len(tokenizer), tied=True)
    model.generation_config.eos_token_id = [5, 7]
    assert stop_ids(tokenizer, model) == {tokenizer.eos_token_id, 5, 7}
    assert stop_ids(tokenizer) == {tokenizer.eos_token_id}


def test_interleaved_models_get_the_same_prompts_in_rotated_order(tokenizer):
    log = []

    def runner(name):
        def run(index):
            log.append((name, index))
            return Sample(1.0, 0.25, [1, 2, 3, 4], "ab" * (index + 1) * (2 if name == "B" else 1))

        return run

    samples = interleave({n: runner(n) for n in "ABC"}, 4, warmup=1)
    assert log[:3] == [("A", 0), ("B", 0), ("C", 0)]  # the warm-up round
    rounds = [log[3 + 3 * i : 6 + 3 * i] for i in range(4)]
    assert [[name for name, _ in r] for r in rounds] == [list("ABC"), list("BCA"), list("CAB"), list("ABC")]
    assert all({index for _, index in r} == {i} for i, r in enumerate(rounds))
    summary = speed_summary(samples, 4, baseline="A", bootstrap={"resamples": 200})
    b = summary["B"]
    assert b["chars_per_second_ratio"]["estimate"] == pytest.approx(2.0)  # twice the text in the same time
    assert b["chars_per_second_ratio"]["low"] == pytest.approx(2.0) and b["chars_per_second_ratio"]["high"] == 2.0
    assert b["chars_per_token_ratio"] == pytest.approx(2.0) and b["time_per_token_ratio"] == 1.0
    assert b["decode_seconds_per_step"] == pytest.approx(0.25) and b["first_token_seconds_mean"] == 0.25
    with pytest.raises(ValueError, match="baseline 'D'"):
        speed_summary(samples, 4, baseline="D")
    with pytest.raises(ValueError, match="no prompts"):
        interleave({"A": runner("A")}, 0)


def test_fixed_length_speeds_pairs_every_prompt_across_models(tokenizer):
    model, other = tiny_llama(len(tokenizer), tied=True), tiny_llama(len(tokenizer), tied=True, seed=3)
    prompts = prompts_from_lines(lines("el", 5), chars=20)
    result = fixed_length_speeds(
        {"candidate": (model, tokenizer), "source": (other, tokenizer), "again": (model, tokenizer)},
        prompts, new_tokens=4, baseline="source", bootstrap={"resamples": 100},
    )  # fmt: skip
    assert result["prompts"] == prompts and result["baseline"] == "source" and result["device"] == "cpu"
    models = result["models"]
    for own in models.values():
        assert own["prompts"] == len(prompts) == len(own["texts"]) == len(own["per_prompt"])
    assert models["candidate"]["texts"] == models["again"]["texts"]  # greedy: the same model writes the same
    ratio = models["candidate"]["chars_per_second_ratio"]
    assert ratio["units"] == len(prompts) and ratio["low"] <= ratio["estimate"] <= ratio["high"]
    assert ratio["estimate"] == pytest.approx(
        models["candidate"]["chars_per_token_ratio"] * models["candidate"]["time_per_token_ratio"]
    )


def test_continuation_text_keeps_a_sentencepiece_leading_space():
    sp = tiny_sp_tokenizer()
    prompt = sp("Open the", add_special_tokens=False).input_ids
    new = sp(" file", add_special_tokens=False).input_ids
    assert sp.decode(new) == "file"  # decoded alone, the decoder strips the word's space
    assert continuation_text(sp, prompt, new) == " file"


def test_tokens_per_byte_and_the_text_independent_speedup(tokenizer):
    text = lines("en", 20)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokens_per_byte(tokenizer, text) == sum(map(len, ids)) / sum(len(t.encode()) for t in text)
    # half the tokens per byte at the same step time: twice as fast; at 1.5x the step time: 4/3
    assert text_independent_speedup(0.4, 0.2, 0.01, 0.01) == pytest.approx(2.0)
    assert text_independent_speedup(0.4, 0.2, 0.01, 0.015) == pytest.approx(4 / 3)


def test_greedy_generations_feed_generation_health(tokenizer):
    model = eos_loving(tokenizer)
    prompts = prompts_from_lines(lines("en", 3), chars=20)
    health = generation_health(tokenizer, greedy_generations(model, tokenizer, prompts, 5), max_new_tokens=5)
    assert health["eos_stop_rate"] == 1.0 and health["mean_new_tokens"] == 0.0 and health["mean_chars"] == 0.0
