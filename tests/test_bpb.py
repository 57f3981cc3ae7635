"""Bits per byte against a hand computation on a tiny random model."""

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vocgraft.eval.bpb import bits_per_byte, make_windows, uniform_bits_per_byte

TEXT = [
    "Η γλώσσα είναι ένα σύστημα επικοινωνίας.",
    "Open the file and save it.",
    "Καλημέρα κόσμε, τι κάνεις σήμερα;",
    "short",
    "Ένα πολύ μεγαλύτερο κείμενο που χρειάζεται πολλά σύμβολα για να γραφτεί ολόκληρο.",
]


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


def hand_nll(model, seq: list[int], max_length: int, stride: int) -> float:
    """Independent of the window code: each token's context is stated directly, one unbatched forward per token."""
    n = len(seq) - 1  # tokens to score: seq[1..n]
    total = 0.0
    for i in range(1, n + 1):
        if i <= max_length:
            start = 0
        else:
            window = math.ceil((i - max_length) / stride)
            end = min(max_length + window * stride, n)  # index of the last label this window scores
            start = end - max_length
        context = torch.tensor([seq[start:i]])
        with torch.no_grad():
            logits = model(input_ids=context).logits[0, -1]
        total -= torch.log_softmax(logits.double(), -1)[seq[i]].item()
    return total


@pytest.mark.parametrize("max_length,stride", [(512, 256), (6, 2), (5, 5)])
def test_bits_per_byte_equals_hand_computation(model, tokenizer, max_length, stride):
    ids = [tokenizer(line, add_special_tokens=False)["input_ids"] for line in TEXT]
    assert max(len(x) for x in ids) > 6  # the short windows really split lines
    expected_nll = sum(hand_nll(model, [tokenizer.bos_token_id, *x], max_length, stride) for x in ids)
    nbytes = sum(len(line.encode()) for line in TEXT)
    result = bits_per_byte(
        model, tokenizer, TEXT, max_length=max_length, stride=stride, batch_size=2, show_progress=False
    )
    assert result["tokens_scored"] == sum(len(x) for x in ids)
    assert result["bytes"] == nbytes
    assert result["nll_nats"] == pytest.approx(expected_nll, rel=1e-5)
    assert result["bits_per_byte"] == pytest.approx(expected_nll / math.log(2) / nbytes, rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(expected_nll / result["tokens_scored"]), rel=1e-5)


def test_window_layout_scores_every_token_once():
    windows = make_windows([11, 12, 13, 14, 15, 16, 17], prefix_id=1, max_length=4, stride=2)
    # seq = [1, 11..17]; first window predicts 11..14, then 2 new tokens per window with 4 tokens of input
    assert [(w.input_ids, w.labels, w.n_scored) for w in windows] == [
        ([1, 11, 12, 13], [11, 12, 13, 14], 4),
        ([12, 13, 14, 15], [13, 14, 15, 16], 2),
        ([13, 14, 15, 16], [14, 15, 16, 17], 1),
    ]
    assert make_windows([], prefix_id=1, max_length=4, stride=2) == []
    with pytest.raises(ValueError, match="stride"):
        make_windows([1], prefix_id=1, max_length=4, stride=5)


def test_batching_and_padding_do_not_change_the_result(model, tokenizer):
    one = bits_per_byte(model, tokenizer, TEXT, batch_size=1, max_length=8, stride=3, show_progress=False)
    many = bits_per_byte(model, tokenizer, TEXT, batch_size=16, max_length=8, stride=3, show_progress=False)
    assert many["nll_nats"] == pytest.approx(one["nll_nats"], rel=1e-5)


def test_eos_inside_the_text_is_scored_even_when_eos_is_the_pad_token(model, tokenizer):
    eos = tokenizer.eos_token_id
    ids = [[5, 6, eos, 7, eos]]
    result = bits_per_byte(model, tokenizer, ["abcde"], token_ids=ids, show_progress=False)
    assert result["tokens_scored"] == 5


class ZeroLogits(torch.nn.Module):
    """A model that knows nothing: every token has the same probability 1/V."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": torch.zeros(*input_ids.shape, self.vocab)})()


def test_a_model_that_knows_nothing_scores_the_uniform_reference(tokenizer):
    result = bits_per_byte(ZeroLogits(len(tokenizer)), tokenizer, TEXT, show_progress=False)
    assert result["bits_per_byte"] == pytest.approx(result["uniform_bits_per_byte"], rel=1e-6)
    assert result["uniform_bits_per_byte"] == pytest.approx(
        result["tokens_scored"] * math.log2(len(tokenizer)) / result["bytes"]
    )
    assert uniform_bits_per_byte(10, 1024, 5) == pytest.approx(20.0)


def test_batches_respect_the_token_budget_and_the_padding_bound():
    from vocgraft.eval.bpb import Window, batches_by_budget

    lengths = [100, 90, 80, 60, 50, 40, 30, 20, 10, 9, 8, 3]
    windows = [Window(list(range(n)), list(range(n)), n) for n in lengths]
    batches = batches_by_budget(windows, max_tokens=200, max_padding=0.25)
    assert sorted(len(w.input_ids) for b in batches for w in b) == sorted(lengths)
    for batch in batches:
        width = len(batch[0].input_ids)
        assert len(batch) == 1 or len(batch) * width <= 200
        assert all(len(w.input_ids) >= 0.75 * width for w in batch)
