"""Downstream metrics and their runners: chrF, ROUGE-L, F1, NLI scoring, generation speed, MT, `vocgraft downstream`."""

import json
import math

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama

from vocgraft.cli import main
from vocgraft.corpus import CorpusError
from vocgraft.eval.canonical_use import CANONICAL_KEYS
from vocgraft.eval.generation import generation_speed, generation_speeds, prompts_from_lines
from vocgraft.eval.metrics import chrf, lcs_length, rouge_l, token_f1, words
from vocgraft.eval.mt import build_prompt, read_pairs, translate_and_score
from vocgraft.eval.tasks import continuation_logprob, continuation_token_logprobs, nli_accuracy, read_records


def test_chrf_matches_sacrebleu_sentence_score_and_orders_hypotheses():
    from sacrebleu.metrics import CHRF

    ref = "Καθορίστε το κείμενο ετικέτας."
    assert chrf([ref], [ref]) == pytest.approx(100.0)
    assert chrf(["xyz"], [ref]) == pytest.approx(0.0)
    hyp = "Καθορίστε κείμενο της ετικέτας"
    assert chrf([hyp], [ref]) == pytest.approx(CHRF().sentence_score(hyp, [ref]).score)
    assert chrf(["Καθορίστε το"], [ref]) < chrf([hyp], [ref])
    with pytest.raises(ValueError, match="2 hypotheses but 1"):
        chrf(["a", "b"], ["a"])


def test_rouge_l_equals_rouge_score_on_english_and_is_hand_checked_on_greek():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    pairs = [
        ("the cat sat on the mat", "the cat is on the mat"),
        ("Police killed the gunman", "the gunman was shot down by police"),
        ("a b c d e", "e d c b a"),
        ("nothing shared here", "completely different words"),
    ]
    for hyp, ref in pairs:
        assert rouge_l(hyp, ref) == pytest.approx(scorer.score(ref, hyp)["rougeL"].fmeasure)
    # Greek: rouge-score's tokenizer drops non-ASCII text entirely; by hand: LCS("η γάτα κάθεται", "η γάτα
    # κοιμάται") = 2 words, P = R = 2/3
    assert scorer.score("η γάτα κοιμάται", "η γάτα κάθεται")["rougeL"].fmeasure == 0.0
    assert rouge_l("Η γάτα κάθεται", "η γάτα κοιμάται") == pytest.approx(2 / 3)
    assert words("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]  # vowel signs stay with their letters
    assert lcs_length("abcbdab", "bdcaba") == 4


def test_token_f1_by_hand():
    assert token_f1("The Eiffel Tower", ["Eiffel Tower"], english=True) == pytest.approx(1.0)
    # pred {in, paris}, gold {paris, france}: common 1, P = R = 1/2
    assert token_f1("in Paris", "Paris, France") == pytest.approx(0.5)
    assert token_f1("Αθήνα", ["Θεσσαλονίκη", "η Αθήνα"]) == pytest.approx(2 / 3)
    assert token_f1("", [""]) == 1.0 and token_f1("x", ["y"]) == 0.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("downstream")
    tokenizer = tiny_bytelevel_tokenizer(500, text=lines("en", 150) + lines("el", 150))
    model = tiny_llama(len(tokenizer), tied=True)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root, model, tokenizer


def test_continuation_logprob_equals_unbatched_scoring(tiny):
    _, model, tokenizer = tiny
    prompt = "The premise. Question: the hypothesis? Answer:"
    labels = [" True", " Neither", " False"]
    got = continuation_logprob(model, tokenizer, prompt, labels)
    prompt_len = len(tokenizer(prompt).input_ids)
    for label, score in zip(labels, got):
        ids = tokenizer(prompt + label).input_ids
        with torch.no_grad():
            logprobs = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        hand = sum(float(logprobs[p - 1, ids[p]]) for p in range(prompt_len, len(ids)))
        assert score == pytest.approx(hand, abs=1e-4)


def test_nli_accuracy_counts_the_argmax_label(tiny):
    """On a tiny Llama: each score's argmax label as gold gives accuracy 1, its argmin 0 (first token: paper 000;
    per byte: the summed log-likelihood over the label's UTF-8 bytes)."""
    _, model, tokenizer = tiny
    records = [{"premise": p, "hypothesis": h} for p, h in zip(lines("en", 6)[:3], lines("en", 6)[3:])]
    template = "{premise} Question: {hypothesis} True, False, or Neither? Answer:"
    words = ["True", "Neither", "False"]
    sizes = [len((" " + w).encode()) for w in words]
    picks = {"accuracy": ([], []), "accuracy_per_byte": ([], [])}
    for r in records:
        lps = continuation_token_logprobs(model, tokenizer, template.format(**r), [" " + w for w in words])
        for name, scores in (
            ("accuracy", [x[0] for x in lps]),
            ("accuracy_per_byte", [sum(x) / n for x, n in zip(lps, sizes)]),
        ):
            picks[name][0].append(max(range(3), key=scores.__getitem__))
            picks[name][1].append(min(range(3), key=scores.__getitem__))
    for name, (best, worst) in picks.items():
        right = [r | {"label": g} for r, g in zip(records, best)]
        wrong = [r | {"label": words[g]} for r, g in zip(records, worst)]
        assert nli_accuracy(model, tokenizer, right, "en")[name] == 1.0
        assert nli_accuracy(model, tokenizer, wrong, "en")[name] == 0.0


class BigramLM(torch.nn.Module):
    """A tiny LM whose next-token log-probabilities depend on the previous token only: ``table[prev]``."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, input_ids, attention_mask=None):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.table[input_ids])


def word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[UNK]")


def bigram_case(after_answer: dict[str, float], after: dict[str, dict[str, float]]):
    words = ["p", "h", "A", "yes", "no", "way", "idea", "maybe"]
    tokenizer = word_tokenizer(words)
    table = torch.full((len(words) + 1, len(words) + 1), -30.0)  # exp(-30): nothing else is likely
    for word, prob in after_answer.items():
        table[tokenizer.convert_tokens_to_ids("A"), tokenizer.convert_tokens_to_ids(word)] = math.log(prob)
    for prev, nexts in after.items():
        for word, prob in nexts.items():
            table[tokenizer.convert_tokens_to_ids(prev), tokenizer.convert_tokens_to_ids(word)] = math.log(prob)
    return BigramLM(table), tokenizer


def test_nli_first_token_and_per_byte_scores_by_hand():
    """Labels of 1 and 2 tokens: the first token prefers "yes", the per-byte log-likelihood "no way"."""
    model, tokenizer = bigram_case({"yes": 0.45, "no": 0.35, "maybe": 0.2}, {"no": {"way": 1.0}})
    templates = {"nli": "{premise} {hypothesis} A", "nli_labels": ["yes", "no way", "maybe"]}
    # by hand: first tokens ln .45 > ln .35 > ln .2; per byte (" yes" 4, " no way" 7, " maybe" 6 bytes):
    # ln(.45)/4 = -0.200, (ln(.35) + ln(1))/7 = -0.150, ln(.2)/6 = -0.268
    assert math.log(0.35) / 7 > math.log(0.45) / 4 > math.log(0.2) / 6
    records = [{"premise": "p", "hypothesis": "h", "label": g} for g in (0, 0, 1)]
    result = nli_accuracy(model, tokenizer, records, "xx", templates)
    assert result["accuracy"] == pytest.approx(2 / 3) and result["accuracy_per_byte"] == pytest.approx(1 / 3)
    assert result["label_bytes"] == [4, 7, 6] and result["first_token_ties"] == 0
    assert set(result["scores"]) == {"accuracy", "accuracy_per_byte"}
    logprobs = continuation_token_logprobs(model, tokenizer, "p h A", [" yes", " no way", " maybe"])
    assert [len(x) for x in logprobs] == [1, 2, 1]
    assert logprobs[1] == pytest.approx([math.log(0.35), 0.0], abs=1e-5)


def test_nli_labels_sharing_their_first_token_tie_and_the_first_label_wins():
    """ "no way" and "no idea" start with the same token: equal first-token scores, label order decides (and the
    tie is counted); per byte, the second token tells them apart."""
    model, tokenizer = bigram_case({"no": 0.6, "yes": 0.4}, {"no": {"way": 0.2, "idea": 0.8}})
    templates = {"nli": "{premise} {hypothesis} A", "nli_labels": ["no way", "no idea", "yes"]}
    # per byte: (ln .6 + ln .2)/7 = -0.303, (ln .6 + ln .8)/8 = -0.092, ln(.4)/4 = -0.229
    records = [{"premise": "p", "hypothesis": "h", "label": g} for g in (0, 1)]
    result = nli_accuracy(model, tokenizer, records, "xx", templates)
    assert result["first_token_ties"] == 2
    assert result["accuracy"] == 0.5 and result["accuracy_per_byte"] == 0.5  # predicted: label 0 vs label 1
    only_second = nli_accuracy(model, tokenizer, records[1:], "xx", templates)
    assert (only_second["accuracy"], only_second["accuracy_per_byte"]) == (0.0, 1.0)


def test_generation_speed_counts_tokens_and_new_token_share(tiny):
    _, model, tokenizer = tiny
    prompts = prompts_from_lines(lines("el", 3), chars=30)
    assert all(len(p) <= 30 for p in prompts)
    every = set(range(len(tokenizer)))
    greedy = generation_speed(model, tokenizer, prompts, sampled=False, max_new_tokens=5, new_token_ids=every)
    assert greedy["generated_tokens"] <= 15 and greedy["tokens_per_second"] > 0
    assert greedy["new_token_share"] == greedy["new_emitted_share"] == 1.0
    # every id new: the canonical encoding of the same text is all new tokens too, and the rate a ratio of sums
    counts = greedy["canonical_counts"]
    assert greedy["new_canonical_share"] == 1.0 and counts["canonical_tokens"] > 0
    assert greedy["canonical_rate"] == counts["emitted_new"] / counts["canonical_new"]
    assert greedy["canonical_matched"] + greedy["noncanonical_new"] <= counts["emitted_new"]
    none = generation_speed(model, tokenizer, prompts, sampled=True, max_new_tokens=5, new_token_ids=set())
    assert none["new_token_share"] == 0.0 and none["mode"] == "sampled"
    assert none["canonical_rate"] is None and none["new_canonical_share"] == 0.0
    plain = generation_speed(model, tokenizer, prompts, sampled=False, max_new_tokens=5)
    assert plain["new_token_share"] is None and all(plain[key] is None for key in CANONICAL_KEYS)


def test_models_measured_interleaved_generate_what_they_generate_alone(tiny):
    """generation_speeds alternates the models prompt by prompt; each model's output (sampled too: seeded per
    prompt) is what it generates when measured alone, so only the timing is shared."""
    _, model, tokenizer = tiny
    other = tiny_llama(len(tokenizer), tied=True, seed=7)
    prompts = prompts_from_lines(lines("el", 3), chars=30)
    for sampled in (False, True):
        alone = [
            generation_speed(m, tokenizer, prompts, sampled=sampled, max_new_tokens=5, seed=3) for m in (model, other)
        ]
        both = generation_speeds(
            [(model, tokenizer, None), (other, tokenizer, None)], prompts, sampled=sampled, max_new_tokens=5, seed=3
        )
        for a, b in zip(alone, both):
            assert (a["generated_tokens"], a["generated_chars"]) == (b["generated_tokens"], b["generated_chars"])
            assert b["seconds"] > 0 and b["prompts"] == len(prompts)
    with pytest.raises(ValueError, match="no prompts"):
        generation_speeds([(model, tokenizer, None)], [], sampled=False)


def test_mt_uses_the_first_pairs_as_examples_and_scores_the_rest(tiny, tmp_path):
    _, model, tokenizer = tiny
    pairs = read_pairs(_parallel("el"))
    result = translate_and_score(model, tokenizer, pairs, "el", shots=2, limit=3, max_new_tokens=6)
    assert result["pairs"] == 3 and 0.0 <= result["chrf"] <= 100.0
    assert [r["source"] for r in result["rows"]] == [en for en, _ in pairs[2:5]]
    prompt = result["prompt_example"]
    assert prompt.splitlines()[0] == f"Translate English to Greek: {pairs[0][0]} = {pairs[0][1]}"
    assert prompt.splitlines()[-1] == f"Translate English to Greek: {pairs[2][0]} ="
    template = "Translate {source_language} to {target_language}: {source} ="
    back = build_prompt(pairs[:1], pairs[1][1], "el", "en", template)
    assert back.endswith(f"Translate Greek to English: {pairs[1][1]} =")
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\ttwo\nno tab here\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad\.tsv:2"):
        read_pairs(bad)


def _parallel(lang):
    from vocgraft.corpus import SHARED_CORPORA

    return SHARED_CORPORA / "parallel" / f"en-{lang}.tsv"


def test_task_records_errors_name_file_and_line(tmp_path):
    path = tmp_path / "nli.jsonl"
    path.write_text('{"premise": "a", "hypothesis": "b", "label": 0}\n{"premise": "a"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"nli\.jsonl:2: a nli record needs hypothesis, label"):
        read_records(path, "nli")
    with pytest.raises(CorpusError, match="unknown task"):
        read_records(path, "qa")


def test_downstream_cli_reports_model_and_baseline(tiny, tmp_path, capsys):
    root, _, _ = tiny
    nli = tmp_path / "nli.jsonl"
    nli.write_text(
        "".join(
            json.dumps({"premise": p, "hypothesis": p[:20], "label": i % 3}) + "\n"
            for i, p in enumerate(lines("el", 4))
        ),
        encoding="utf-8",
    )
    span = tmp_path / "span.jsonl"
    span.write_text(json.dumps({"context": "Η Αθήνα.", "question": "Πού;", "answers": ["Αθήνα"]}) + "\n")
    summ = tmp_path / "sum.jsonl"
    summ.write_text(json.dumps({"text": lines("el", 1)[0], "summary": lines("el", 2)[1]}) + "\n")
    out = tmp_path / "downstream.json"
    args = ["downstream", "--model", str(root / "model"), "--baseline", str(root / "model"), "--lang", "el"]
    args += ["--prompts", str(_parallel("el").parent.parent / "el" / "heldout.txt"), "--num-prompts", "2"]
    args += ["--max-new-tokens", "4", "--mt", str(_parallel("el")), "--mt-limit", "2", "--shots", "1"]
    args += ["--task", f"nli={nli}", "--task", f"span={span}", "--task", f"sum={summ}", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "chrF" in printed and "tokens/s" in printed and "accuracy_per_byte" in printed
    assert "canonical rate" in printed and "non-canonical" in printed
    assert "nli accuracy: label whose first token" in printed
    report = json.loads(out.read_text())
    assert len(report["results"]) == 2
    first = report["results"][0]
    assert [g["mode"] for g in first["generation"]] == ["greedy", "sampled"]
    assert [m["direction"] for m in first["mt"]] == ["en-el", "el-en"]
    assert {t["task"] for t in first["tasks"]} == {"nli", "span", "sum"}
    assert main(["downstream", "--model", str(root / "model"), "--lang", "el", "--task", "nli"]) == 2
