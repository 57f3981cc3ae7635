"""Downstream metrics and their runners: chrF, ROUGE-L, F1, NLI scoring, generation speed, MT, `vocgraft downstream`."""

import json

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama

from vocgraft.cli import main
from vocgraft.corpus import CorpusError
from vocgraft.eval.generation import generation_speed, prompts_from_lines
from vocgraft.eval.metrics import chrf, lcs_length, rouge_l, token_f1, words
from vocgraft.eval.mt import build_prompt, read_pairs, translate_and_score
from vocgraft.eval.tasks import continuation_logprob, nli_accuracy, read_records


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
    _, model, tokenizer = tiny
    records = [{"premise": p, "hypothesis": h} for p, h in zip(lines("en", 6)[:3], lines("en", 6)[3:])]
    template = "{premise} Question: {hypothesis} True, False, or Neither? Answer:"
    best, worst = [], []
    for r in records:
        scores = continuation_logprob(model, tokenizer, template.format(**r), [" True", " Neither", " False"])
        best.append(max(range(3), key=scores.__getitem__))
        worst.append(min(range(3), key=scores.__getitem__))
    right = [r | {"label": g} for r, g in zip(records, best)]
    wrong = [r | {"label": ["True", "Neither", "False"][g]} for r, g in zip(records, worst)]
    assert nli_accuracy(model, tokenizer, right, "en")["accuracy"] == 1.0
    assert nli_accuracy(model, tokenizer, wrong, "en")["accuracy"] == 0.0


def test_generation_speed_counts_tokens_and_new_token_share(tiny):
    _, model, tokenizer = tiny
    prompts = prompts_from_lines(lines("el", 3), chars=30)
    assert all(len(p) <= 30 for p in prompts)
    every = set(range(len(tokenizer)))
    greedy = generation_speed(model, tokenizer, prompts, sampled=False, max_new_tokens=5, new_token_ids=every)
    assert greedy["generated_tokens"] <= 15 and greedy["tokens_per_second"] > 0
    assert greedy["new_token_share"] == 1.0
    none = generation_speed(model, tokenizer, prompts, sampled=True, max_new_tokens=5, new_token_ids=set())
    assert none["new_token_share"] == 0.0 and none["mode"] == "sampled"
    assert generation_speed(model, tokenizer, prompts, sampled=False, max_new_tokens=5)["new_token_share"] is None


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
    assert "chrF" in printed and "tokens/s" in printed and "accuracy" in printed
    report = json.loads(out.read_text())
    assert len(report["results"]) == 2
    first = report["results"][0]
    assert [g["mode"] for g in first["generation"]] == ["greedy", "sampled"]
    assert [m["direction"] for m in first["mt"]] == ["en-el", "el-en"]
    assert {t["task"] for t in first["tasks"]} == {"nli", "span", "sum"}
    assert main(["downstream", "--model", str(root / "model"), "--lang", "el", "--task", "nli"]) == 2
