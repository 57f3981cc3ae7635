"""Bootstrap intervals of ratio-of-sums metrics, and bits/byte per line with its interval."""

import math

import pytest
from test_bpb import TEXT, ZeroLogits, model, tokenizer  # noqa: F401  (module fixtures reused)

from vocgraft.eval.bootstrap import bootstrap_interval, bootstrap_ratio_interval, resample_counts
from vocgraft.eval.bpb import (
    bits_per_byte,
    bits_per_byte_interval,
    heldout_bits_per_byte,
    paired_bits_per_byte_difference,
)


def test_resamples_draw_every_unit_with_replacement():
    counts = resample_counts(5, 200, seed=1)
    assert counts.shape == (200, 5)
    assert (counts.sum(dim=1) == 5).all()  # n draws per resample
    assert (counts.max(dim=1).values > 1).any()  # with replacement


def test_two_units_give_the_known_distribution_of_the_mean():
    """Values 0 and 1: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4; so the central 95% spans
    [0, 1] and the central 40% is exactly 1/2."""
    wide = bootstrap_interval([0.0, 1.0], resamples=4000, confidence=0.95)
    assert (wide["estimate"], wide["low"], wide["high"]) == (0.5, 0.0, 1.0)
    narrow = bootstrap_interval([0.0, 1.0], resamples=4000, confidence=0.4)
    assert (narrow["low"], narrow["high"]) == (0.5, 0.5)
    assert wide["units"] == 2 and wide["resamples"] == 4000 and wide["dropped"] == 0


def test_ratio_of_sums_not_mean_of_ratios_and_equal_ratios_give_a_point():
    # bits 1, 9 over bytes 1, 3: ratio of sums 10/4, mean of ratios 2
    assert bootstrap_interval([1, 9], [1, 3])["estimate"] == pytest.approx(2.5)
    same = bootstrap_interval([2, 4, 6], [1, 2, 3])  # every unit at 2 bits/byte: no resample can move it
    assert same["low"] == same["high"] == same["estimate"] == pytest.approx(2.0)


def test_seeded_deterministic_and_the_interval_holds_the_estimate():
    bits = [3.0 + (i * 7919 % 13) / 4 for i in range(300)]
    nbytes = [10 + i % 7 for i in range(300)]
    a = bootstrap_interval(bits, nbytes, seed=5)
    assert a == bootstrap_interval(bits, nbytes, seed=5)
    assert a != bootstrap_interval(bits, nbytes, seed=6)
    assert a["low"] < a["estimate"] < a["high"]
    assert a["estimate"] == pytest.approx(sum(bits) / sum(nbytes))
    wider = bootstrap_interval(bits, nbytes, seed=5, confidence=0.99)
    assert wider["low"] < a["low"] and wider["high"] > a["high"]


def test_paired_difference_of_identical_arms_is_exactly_zero_and_a_shift_is_exact():
    bits = [float(i % 5 + 1) for i in range(50)]
    nbytes = [2.0] * 50
    same = bootstrap_interval(bits, nbytes, minus=(bits, nbytes))
    assert same["estimate"] == same["low"] == same["high"] == 0.0
    # arm A costs exactly 1 bit more on every 2-byte line: +0.5 bits/byte on every resample
    shifted = bootstrap_interval([b + 1 for b in bits], nbytes, minus=(bits, nbytes))
    assert shifted["low"] == pytest.approx(0.5) and shifted["high"] == pytest.approx(0.5)
    # unpaired, each arm alone varies: the paired interval is what removes the shared variation
    alone = bootstrap_interval(bits, nbytes)
    assert alone["high"] - alone["low"] > 0.1


def test_ratio_interval_of_a_model_twice_as_fast_on_every_prompt():
    chars = [10.0, 30.0, 20.0, 5.0]
    seconds = [1.0, 2.0, 4.0, 0.5]
    result = bootstrap_ratio_interval([2 * c for c in chars], seconds, chars, seconds)
    assert result["estimate"] == result["low"] == result["high"] == pytest.approx(2.0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="lengths"):
        bootstrap_interval([1, 2], [1])
    with pytest.raises(ValueError, match="at least one unit"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([1], confidence=1.5)


def test_bits_per_line_sum_to_the_total_and_windows_keep_their_line(model, tokenizer):  # noqa: F811
    # windows of 6 tokens split the long lines: the per-line sums must still gather every window of a line
    result = bits_per_byte(model, tokenizer, TEXT, max_length=6, stride=2, batch_size=3, per_line=True,
                           show_progress=False)  # fmt: skip
    assert len(result["bits_per_line"]) == len(TEXT)
    assert result["bytes_per_line"] == [len(line.encode()) for line in TEXT]
    assert sum(result["bits_per_line"]) == pytest.approx(result["nll_nats"] / math.log(2), rel=1e-6)
    for index, line in enumerate(TEXT):  # each line alone gives its own bits
        alone = bits_per_byte(model, tokenizer, [line], max_length=6, stride=2, show_progress=False)
        assert result["bits_per_line"][index] == pytest.approx(alone["nll_nats"] / math.log(2), rel=1e-5)
    interval = bits_per_byte_interval(result, resamples=500)
    assert interval["estimate"] == pytest.approx(result["bits_per_byte"], rel=1e-6)  # float32 sums per batch
    assert interval["low"] <= interval["estimate"] <= interval["high"]
    assert "bits_per_line" not in bits_per_byte(model, tokenizer, TEXT, show_progress=False)


def test_heldout_reads_a_file_and_compares_two_models_paired(model, tokenizer, tmp_path):  # noqa: F811
    path = tmp_path / "heldout.txt"
    path.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    trained = heldout_bits_per_byte(model, tokenizer, path, limit=4, show_progress=False)
    assert trained["bytes"] == sum(len(line.encode()) for line in TEXT[:4])
    assert trained["interval"]["confidence"] == 0.95 and trained["interval"]["units"] == 4
    uniform = heldout_bits_per_byte(ZeroLogits(len(tokenizer)), tokenizer, TEXT[:4], show_progress=False)
    difference = paired_bits_per_byte_difference(uniform, trained)
    assert difference["estimate"] == pytest.approx(uniform["bits_per_byte"] - trained["bits_per_byte"], abs=1e-5)
    assert difference["low"] <= difference["estimate"] <= difference["high"]
    with pytest.raises(ValueError, match="same lines"):
        paired_bits_per_byte_difference(uniform, heldout_bits_per_byte(model, tokenizer, TEXT, show_progress=False))


def test_english_heldout_is_one_call():
    """Part 3 of issue 31: English held-out bits/byte is the same call on the shared English held-out file."""
    from tiny import tiny_bytelevel_tokenizer, tiny_llama

    from vocgraft.corpus import SHARED_CORPORA

    tok = tiny_bytelevel_tokenizer()
    result = heldout_bits_per_byte(
        tiny_llama(len(tok), tied=True), tok, SHARED_CORPORA / "en" / "heldout.txt", limit=20, show_progress=False
    )
    assert result["interval"]["units"] == 20 and result["bits_per_byte"] > 0
