"""Downstream task formats over a user's JSONL files: NLI (accuracy), SUM (ROUGE-L), SPAN (token F1).

Records:
  nli   {"premise": ..., "hypothesis": ..., "label": 0|1|2 or a label word}  (0 entailment, 1 neutral, 2 contradiction)
  sum   {"text": ..., "summary": ...}
  span  {"context": ..., "question": ..., "answers": [...] or "..."}

NLI is scored two ways, both reported (the metrics of ``NLI``):

- ``accuracy``, paper 000's form (§C.2, Table 4: NLI generates one token): the prediction is the label word whose
  *first token* has the highest log-likelihood after the prompt. Labels whose first tokens coincide under a
  tokenizer (the three Greek labels all start with ``▁`` under Llama 2, with the byte ``ĠÎ`` under GPT-2) tie
  exactly; the first label in label order wins, and ``first_token_ties`` counts the records where that happened.
- ``accuracy_per_byte``: the label with the highest log-likelihood per UTF-8 byte, summed over all of its tokens
  and divided by the bytes of the scored text (the label with its leading space). Unlike a sum over tokens, it does
  not charge a label for the number of tokens a vocabulary needs to spell it, so source and adapted models are
  compared on the same footing (a sum over tokens favours whichever labels a vocabulary spells in fewer tokens).

SUM and SPAN decode greedily (128 and 8 new tokens, paper 000 Table 4) and score the text before the first line
break. The prompt templates of paper 000 Table 5 ship for its eight languages; ``templates`` overrides any of them.

Each task is declared once, at the end of this module, with its fields, runner, templates, answer budget and
metrics (:mod:`vocgraft.eval.registry`); reports and the pipeline find it there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from vocgraft.corpus import CorpusError, numbered_lines
from vocgraft.eval.generation import first_line_answer
from vocgraft.eval.metrics import rouge_l, token_f1
from vocgraft.eval.registry import Metric, RegistryError, Task, register_task
from vocgraft.eval.registry import task as get_task

# label words in label order: entailment, neutral, contradiction
NLI_LABELS = {
    "en": ("True", "Neither", "False"),
    "ar": ("صحيح", "لا هذا ولا ذاك", "خطأ"),
    "de": ("Wahr", "Weder", "Falsch"),
    "el": ("Αληθής", "Κανένα από τα δύο", "Ψευδής"),
    "hi": ("सही", "ना तो सही ना गलत", "गलत"),
    "ja": ("真", "どちらでもない", "偽"),
    "sw": ("Kweli", "Wala", "Uongo"),
    "th": ("จริง", "ไม่แน่ใจ", "เท็จ"),
}


def read_records(path: str | Path, task: str) -> list[dict]:
    """The task's JSONL records; a missing field or bad JSON is an error naming the file and line."""
    try:
        fields = get_task(task).fields
    except RegistryError as exc:
        raise CorpusError(str(exc)) from None
    records = []
    for number, line in numbered_lines(path, f"JSONL records with fields {', '.join(fields)}"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{number}: not valid JSON ({exc.msg}).") from None
        missing = [f for f in fields if f not in record]
        if missing:
            raise CorpusError(f"{path}:{number}: a {task} record needs {', '.join(missing)}.")
        records.append(record)
    if not records:
        raise CorpusError(f"{path}: no records.")
    return records


def template_for(task: str, lang: str, templates: dict | None = None) -> str:
    override = (templates or {}).get(task)
    if override:
        return override
    shipped = get_task(task).templates
    if lang not in shipped:
        raise CorpusError(f"no shipped {task} template for {lang!r} (shipped: {', '.join(shipped)}); pass one.")
    return shipped[lang]


def _device_of(model) -> torch.device:
    """Where the model's inputs go: its ``device`` (transformers models), else its first weight's, else the CPU."""
    device = getattr(model, "device", None)
    if device is not None:
        return torch.device(device)
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def continuation_token_logprobs(model, tokenizer, prompt: str, continuations: Sequence[str]) -> list[list[float]]:
    """Log-probability of each token of each continuation after ``prompt`` (one batch, right-padded)."""
    prompt_ids = tokenizer(prompt, add_special_tokens=True).input_ids
    sequences = []
    for text in continuations:
        full = tokenizer(prompt + text, add_special_tokens=True).input_ids
        if full[: len(prompt_ids)] != prompt_ids:
            # a token merged across the prompt/continuation boundary: keep the prompt's own tokens so every
            # label is scored after the same context
            full = prompt_ids + tokenizer(text, add_special_tokens=False).input_ids
        sequences.append(full)
    width = max(len(s) for s in sequences)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    with torch.no_grad():
        device = _device_of(model)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        logprobs = logits.float().log_softmax(-1).cpu()
    return [
        [float(logprobs[row, p - 1, seq[p]]) for p in range(len(prompt_ids), len(seq))]
        for row, seq in enumerate(sequences)
    ]


def continuation_logprob(model, tokenizer, prompt: str, continuations: Sequence[str]) -> list[float]:
    """Sum of log-probabilities of each continuation's tokens after ``prompt``."""
    return [sum(lps) for lps in continuation_token_logprobs(model, tokenizer, prompt, continuations)]


def _argmax(scores: Sequence[float]) -> int:
    return max(range(len(scores)), key=scores.__getitem__)  # the first of equal maxima: label order breaks ties


def nli_accuracy(model, tokenizer, records: Sequence[dict], lang: str, templates: dict | None = None) -> dict:
    """Both NLI scores (the metrics of ``NLI``) over ``records``, with the number of first-token ties."""
    template = template_for(NLI.name, lang, templates)
    labels = list((templates or {}).get("nli_labels") or NLI_LABELS.get(lang) or NLI_LABELS["en"])
    continuations = [" " + word for word in labels]
    label_bytes = [len(text.encode("utf-8")) for text in continuations]
    correct = {"accuracy": 0, "accuracy_per_byte": 0}
    ties = 0
    for record in records:
        gold = record["label"] if isinstance(record["label"], int) else labels.index(record["label"])
        prompt = template.format(premise=record["premise"], hypothesis=record["hypothesis"])
        logprobs = continuation_token_logprobs(model, tokenizer, prompt, continuations)
        first = [lps[0] for lps in logprobs]
        per_byte = [sum(lps) / n for lps, n in zip(logprobs, label_bytes)]
        ties += first.count(max(first)) > 1
        correct["accuracy"] += _argmax(first) == gold
        correct["accuracy_per_byte"] += _argmax(per_byte) == gold
    n = len(records)
    return {
        "task": NLI.name,
        "records": n,
        **{m.name: correct[m.name] / n for m in NLI.metrics},
        "scores": {m.name: m.description for m in NLI.metrics},
        "first_token_ties": ties,
        "labels": labels,
        "label_bytes": label_bytes,
    }


def sum_rouge(model, tokenizer, records: Sequence[dict], lang: str, templates: dict | None = None) -> dict:
    template = template_for(SUM.name, lang, templates)
    scores = [
        rouge_l(first_line_answer(model, tokenizer, template.format(text=r["text"]), SUM.max_new_tokens), r["summary"])
        for r in records
    ]
    return {"task": SUM.name, "records": len(records), "rouge_l": sum(scores) / len(scores)}


def span_f1(model, tokenizer, records: Sequence[dict], lang: str, templates: dict | None = None) -> dict:
    template = template_for(SPAN.name, lang, templates)
    scores = []
    for r in records:
        prompt = template.format(context=r["context"], question=r["question"])
        answer = first_line_answer(model, tokenizer, prompt, SPAN.max_new_tokens)
        scores.append(token_f1(answer, r["answers"], english=lang == "en"))
    return {"task": SPAN.name, "records": len(records), "f1": sum(scores) / len(scores)}


# ---------------------------------------------------------------------------------------------------------------
# the tasks, each declared once; metrics are summarized as <task>_<metric> (nli_accuracy_per_byte)

NLI = register_task(
    Task(
        name="nli",
        label="NLI",
        fields=("premise", "hypothesis", "label"),
        runner=nli_accuracy,
        templates={
            "en": "{premise} Question: {hypothesis} True, False, or Neither? Answer:",
            "ar": "{premise} سؤال: {hypothesis} صحيح، خطأ، أم لا هذا ولا ذاك؟ إجابة:",
            "de": "{premise} Frage: {hypothesis} Wahr, Falsch oder Weder? Antwort:",
            "el": "{premise} Ερώτηση: {hypothesis} Αληθής, Ψευδής, ή Κανένα από τα δύο; Απάντηση:",
            "hi": "{premise} प्रश्न: {hypothesis} सही, ना तो सही ना गलत, गलत? उत्तर:",
            "ja": "{premise} 質問: {hypothesis} 真、偽、どちらでもない? 答え:",
            "sw": "{premise} Swali: {hypothesis} Kweli, Uongo au Wala? Jibu:",
            "th": "{premise} คำถาม: {hypothesis} จริง, เท็จ, ไม่แน่ใจ? คำตอบ:",
        },
        metrics=(
            Metric(
                "accuracy",
                "accuracy",
                True,
                description="label whose first token is most likely after the prompt (paper 000 §C.2; ties: first "
                "label)",
            ),
            Metric(
                "accuracy_per_byte",
                "accuracy_per_byte",
                True,
                description="label with the highest log-likelihood per UTF-8 byte, over all its tokens",
            ),
        ),
    )
)
SUM = register_task(
    Task(
        name="sum",
        label="SUM",
        fields=("text", "summary"),
        runner=sum_rouge,
        templates={
            "en": "Write a short summary of the following text in English. Article: {text} Summary:",
            "ar": "اكتب ملخصًا قصيرًا للنص التالي باللغة العربية. المقالة: {text} الملخص:",
            "de": "Schreiben Sie eine kurze Zusammenfassung des folgenden Textes auf Deutsch. Artikel: {text} "
            "Zusammenfassung:",
            "el": "Γράψε μια σύντομη περίληψη του παρακάτω κειμένου στα ελληνικά. Άρθρο: {text} Περίληψη:",
            "hi": "निम्नलिखित का संक्षेप हिंदी में लिखे। लेख: {text} संक्षेप:",
            "ja": "次の文章の要約を日本語で書きなさい。記事: {text} 要約:",
            "sw": "Andika muhtasari mfupi wa maandishi yafuatayo kwa Kiswahili. Makala: {text} Muhtasari:",
            "th": "เขียนสรุปสั้น ๆ ของข้อความต่อไปนี้เป็นภาษาไทย บทความ: {text} สรุป:",
        },
        metrics=(Metric("rouge_l", "rouge_l", True, description="ROUGE-L F1 of the answer's first line"),),
        max_new_tokens=128,
    )
)
SPAN = register_task(
    Task(
        name="span",
        label="SPAN",
        fields=("context", "question", "answers"),
        runner=span_f1,
        templates={
            "en": "Answer the following question. Context: {context} Question: {question} Answer:",
            "ar": "أجب على السؤال التالي. السياق: {context} السؤال: {question} الإجابة:",
            "de": "Beantworten Sie die folgende Frage. Artikel: {context} Frage: {question} Antwort:",
            "el": "Απάντησε στην παρακάτω ερώτηση. Κείμενο: {context} Ερώτηση: {question} Απάντηση:",
            "hi": "इस प्रश्न का उत्तर दें। संदर्भ: {context} प्रश्न: {question} उत्तर:",
            "ja": "次の文章の質問に答えなさい。文章: {context} 質問: {question} 答え:",
            "sw": "Jibu swali lifuatalo. Makala: {context} Swali: {question} Jibu:",
            "th": "ตอบคำถามอันต่อไปนี้ บทความ: {context} คำถาม: {question} คำตอบ:",
        },
        metrics=(Metric("f1", "f1", True, description="SQuAD token F1 of the answer's first line, best gold answer"),),
        max_new_tokens=8,
    )
)
