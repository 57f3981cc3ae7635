"""The inputs of the reliability battery (tests/test_reliability*.py): a tiny model, small corpora in several
scripts, and the broken files a careless or unlucky user hands over (UTF-16, compressed, truncated weights, ...).

Everything is built once per module in a temporary folder, in seconds, from the shared corpora.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tiny import lines, tiny_source_dir, tiny_unigram_tokenizer, tiny_wordpiece_tokenizer

import vocgraft

SRC = Path(vocgraft.__file__).resolve().parents[1]  # the code under test (a subprocess runs the same)


def build_world(root: Path) -> Path:
    """``root`` with: ``source/`` (tiny tied Llama, byte-level BPE), ``el.txt``/``en.txt``/``ja.txt``,
    broken corpora, odd tokenizers and models, a parallel file, templates and pipeline configs."""
    tiny_source_dir(root, tied=True, el=lines("el", 300), en=lines("en", 200), ja=lines("ja", 150))
    el = (root / "el.txt").read_bytes()
    text = el.decode("utf-8")
    (root / "heldout-el.txt").write_text("\n".join(lines("el", 400)[300:]) + "\n", encoding="utf-8")
    (root / "utf16.txt").write_bytes(text.encode("utf-16"))  # with a BOM, as Windows editors save it
    (root / "utf32.txt").write_bytes(text.encode("utf-32"))
    (root / "el.txt.gz").write_bytes(gzip.compress(el))
    (root / "el.txt.bz2").write_bytes(bz2.compress(el))
    (root / "el.txt.xz").write_bytes(lzma.compress(el))
    with zipfile.ZipFile(root / "el.zip", "w") as archive:
        archive.writestr("el.txt", el)
    (root / "gz-named.txt").write_bytes(gzip.compress(el))  # a compressed file under a .txt name
    (root / "latin1.txt").write_bytes("café crème\nnaïve déjà vu\n".encode("latin-1"))
    (root / "empty.txt").write_bytes(b"")
    (root / "blank.txt").write_text("\n   \n\t\n", encoding="utf-8")
    (root / "crlf.txt").write_bytes(el.replace(b"\n", b"\r\n"))
    (root / "bom8.txt").write_bytes(b"\xef\xbb\xbf" + el)
    (root / "wrong-field.jsonl").write_text('{"body": "x"}\n', encoding="utf-8")
    (root / "bad.jsonl").write_text('{"text": "x"\n', encoding="utf-8")
    (root / "nofiles").mkdir()
    (root / "afile").write_text("a plain file\n", encoding="utf-8")

    tiny_unigram_tokenizer().save_pretrained(root / "unigram")
    tiny_wordpiece_tokenizer().save_pretrained(root / "wordpiece")

    (root / "corrupt.gguf").write_bytes(b"GGUF" + os.urandom(2000))
    shutil.copytree(root / "source", root / "truncated")
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    shutil.copytree(root / "source", root / "notokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (root / "notokenizer" / name).unlink(missing_ok=True)
    (root / "noconfig").mkdir()
    (root / "noconfig" / "weights.bin").write_bytes(b"")
    # a model directory asking to run its own code: it must load as the plain Llama it says it is, never run evil.py
    shutil.copytree(root / "source", root / "evil")
    config = json.loads((root / "evil" / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel", "AutoConfig": "evil.EvilConfig"}
    (root / "evil" / "config.json").write_text(json.dumps(config))
    marker = root / "evil-ran"
    (root / "evil" / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")

    pairs = [
        f"{en}\t{el}" for en, el in zip(["Good morning.", "Thank you.", "Where is it?", "Yes.", "No."], lines("el", 5))
    ]
    (root / "pairs.tsv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    (root / "templates-bad.json").write_text('{"nli": "x" ', encoding="utf-8")
    (root / "templates-list.json").write_text("[1, 2]", encoding="utf-8")
    (root / "nli.jsonl").write_text(
        json.dumps({"premise": "a", "hypothesis": "b", "label": "entailment"}) + "\n", encoding="utf-8"
    )
    build_damaged_models(root)
    build_second_battery_inputs(root)
    return root


def build_damaged_models(root: Path) -> None:
    """Issue 24's inputs: streams, a line past the limit, a word that kept BPE training busy for minutes, and model
    folders damaged in the ways downloads and hand edits damage them (a sharded copy of the source for those)."""
    import random
    import string
    import struct

    import torch
    from safetensors.torch import load_file, save_file
    from tiny import tiny_bytelevel_tokenizer, tiny_llama
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, PreTrainedTokenizerFast

    os.mkfifo(root / "fifo")
    (root / "longline.txt").write_bytes(b"x" * (3 << 19) + b"\n")  # 1.5 MiB on one line
    word = "".join(random.Random(0).choices(string.ascii_letters, k=500_000))  # a base64-like blob, one word
    (root / "longword.txt").write_text((root / "el.txt").read_text(encoding="utf-8") + word + "\n", encoding="utf-8")
    (root / "latin1.yaml").write_bytes("model: caf\xe9\n".encode("latin-1"))

    tokenizer = tiny_bytelevel_tokenizer()
    tiny_llama(len(tokenizer), tied=False).save_pretrained(root / "sharded", max_shard_size="20KB")
    tokenizer.save_pretrained(root / "sharded")
    index = json.loads((root / "sharded" / "model.safetensors.index.json").read_text())
    embeddings = index["weight_map"]["model.embed_tokens.weight"]

    def damaged(name: str) -> Path:
        shutil.copytree(root / "sharded", root / name)
        return root / name

    shard = damaged("short-shard") / embeddings
    shard.write_bytes(shard.read_bytes()[:-1000])
    shard = damaged("huge-header") / embeddings
    shard.write_bytes(struct.pack("<Q", 1 << 62) + shard.read_bytes()[8:])
    (damaged("no-weight-map") / "model.safetensors.index.json").write_text('{"metadata": {}}')
    for name, change in (("wrong-shape", lambda t: t[:, :16].contiguous()), ("nan-rows", None)):
        shard = damaged(name) / embeddings
        tensors = load_file(shard)
        if change:
            tensors["model.embed_tokens.weight"] = change(tensors["model.embed_tokens.weight"])
        else:
            tensors["model.embed_tokens.weight"][[5, 9]] = float("nan")
        save_file(tensors, shard, metadata={"format": "pt"})
    config = json.loads((root / "sharded" / "config.json").read_text())
    (damaged("unknown-type") / "config.json").write_text(json.dumps(config | {"model_type": "llamaz"}))
    bert = BertConfig(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], num_attention_heads=4)
    (damaged("encoder-config") / "config.json").write_text(bert.to_json_string())
    tiny_bytelevel_tokenizer(600).save_pretrained(damaged("tokenizer-over-rows"))
    path = damaged("merges-unknown") / "tokenizer.json"
    spec = json.loads(path.read_text())
    merges = spec["model"]["merges"]
    merges.append(["zzqq", "qqzz"] if isinstance(merges[0], list) else "zzqq qqzz")
    path.write_text(json.dumps(spec))
    path = damaged("truncated-tokenizer") / "tokenizer.json"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    nan_norm = tiny_llama(len(tokenizer), tied=True)
    with torch.no_grad():
        nan_norm.model.norm.weight.fill_(float("nan"))  # finite rows, NaN outputs
    nan_norm.save_pretrained(root / "nan-outputs")
    tokenizer.save_pretrained(root / "nan-outputs")
    # a word-level tokenizer that knows a few English words: Greek text is all [UNK]
    vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(["the", "a", "of", "and", "to", "in"])}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    words = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="</s>")
    tiny_llama(len(words), tied=True).save_pretrained(root / "word-level")
    words.save_pretrained(root / "word-level")
    no_bos = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tiny_llama(len(no_bos), tied=True).save_pretrained(root / "no-bos-eos")
    no_bos.save_pretrained(root / "no-bos-eos")


def build_second_battery_inputs(root: Path) -> None:
    """Issue 24's second battery (benchmarks/reliability_battery2.py): text that is UTF-8 but not text, a file far
    too large for what it is given as, a YAML file whose anchors hold 10^9 elements, and model folders with files of
    the wrong shape."""
    (root / "utf16le-nobom.txt").write_bytes((root / "en.txt").read_text(encoding="utf-8").encode("utf-16-le"))
    with open(root / "sparse-2g.tsv", "wb") as fh:  # 2 GiB of NUL bytes, no line break, no disk space
        fh.truncate(2 << 30)
    laughs = "model: [&a [x, x, x, x, x, x, x, x, x, x]"
    for level in range(1, 9):
        laughs += f", &{chr(97 + level)} [" + ", ".join([f"*{chr(96 + level)}"] * 10) + "]"
    (root / "laughs.yaml").write_text(laughs + "]\n", encoding="utf-8")

    def model_copy(name: str) -> Path:
        shutil.copytree(root / "source", root / name)
        return root / name

    (model_copy("tokjson-object-wrong") / "tokenizer.json").write_text('{"model": 5}')
    config = json.loads((root / "source" / "config.json").read_text())
    (model_copy("config-hidden-negative") / "config.json").write_text(json.dumps(config | {"hidden_size": -32}))
    loop = model_copy("safetensors-loop") / "model.safetensors"
    loop.unlink()
    loop.symlink_to("model.safetensors")


def write_config(root: Path, name: str, **changes) -> Path:
    """A pipeline YAML on the tiny source with ``changes`` (section.key=value as nested dicts) applied."""
    import yaml

    config = {
        "model": str(root / "source"),
        "corpus": str(root / "el.txt"),
        "heldout": str(root / "heldout-el.txt"),
        "lang": "el",
        "out": str(root / "runs" / name),
        "adapt": {"mode": "expand", "new_tokens": 20, "init": "mean", "aux_vocab_size": 600},
        "eval": {"limit": 20, "max_length": 64},
    }
    for key, value in changes.items():
        section, _, sub = key.partition("__")
        if sub:
            config.setdefault(section, {})[sub] = value
        else:
            config[section] = value
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


def cli_process(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    """`python -m vocgraft.cli ARGS` in a new process (its own process group, so a signal reaches only it)."""
    env = os.environ | {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "vocgraft.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def snapshot(root: Path) -> set[str]:
    """Every path under ``root`` (hidden ones included), relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}
