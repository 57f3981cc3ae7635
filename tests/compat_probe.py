"""What a user's ``transformers`` makes of a saved model directory, as one JSON line (run as a script, so each
version is imported in a fresh process; it imports nothing from vocgraft):

    python tests/compat_probe.py HELDOUT_TXT MODEL_DIR [MODEL_DIR ...]
    ->  {"MODEL_DIR": {"transformers": "4.45.2", "ids": [[...], ...], ...}, ...}

tests/test_transformers_compat.py runs it under the oldest supported transformers and the current one and compares.
"""

from __future__ import annotations

import json
import sys
import warnings

ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")
NEW_TOKENS = 6


def probe(model_dir: str, heldout: list[str]) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    found = {
        "transformers": transformers.__version__,
        "length": len(tokenizer),
        "ids": [tokenizer(line)["input_ids"] for line in heldout],  # with the tokenizer's own bos/eos handling
        "roundtrip": [tokenizer.decode(tokenizer(line, add_special_tokens=False)["input_ids"]) for line in heldout],
        "roles": {role: [getattr(tokenizer, role), getattr(tokenizer, role + "_id")] for role in ROLES},
        "special_tokens": sorted(tokenizer.all_special_tokens),
        "added_tokens": {str(i): [t.content, t.special] for i, t in sorted(tokenizer.added_tokens_decoder.items())},
        "chat": None,
    }
    if tokenizer.chat_template is not None:
        messages = [
            {"role": "user", "content": heldout[0]},
            {"role": "assistant", "content": heldout[1]},
            {"role": "user", "content": heldout[2]},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        found["chat"] = text
        found["chat_ids"] = tokenizer(text, add_special_tokens=False)["input_ids"]

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    embeddings, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    found["rows"] = embeddings.shape[0]
    found["tied"] = embeddings.data_ptr() == head.data_ptr()
    found["dtype"] = str(embeddings.dtype)
    # the way users call it: everything the tokenizer returns goes to generate (4.x rejects token_type_ids)
    inputs = tokenizer(heldout[0], return_tensors="pt")
    found["input_names"] = sorted(inputs.keys())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=pad)
    found["generated"] = out[0, inputs["input_ids"].shape[1] :].tolist()
    return found


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    with open(sys.argv[1], encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh if line.strip()]
    found = {}
    for folder in sys.argv[2:]:
        try:
            found[folder] = probe(folder, lines)
        except Exception as exc:  # reported per folder, so one broken output does not hide the others
            found[folder] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(found, ensure_ascii=False))
