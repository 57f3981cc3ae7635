"""benchmarks/llama_cpp_speed.py's loop, with a fake engine in place of llama.cpp (the real one runs in the
benchmark): exactly N tokens per prompt even when EOS is the argmax, a cleared cache before every prompt, and the
characters decoded by the model's own tokenizer."""

import ctypes
import sys
from pathlib import Path
from types import SimpleNamespace

from tiny import lines, tiny_bytelevel_tokenizer

from vocgraft.eval.generation import prompts_from_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from llama_cpp_speed import llama_cpp_speeds  # noqa: E402


def fake_llama_cpp(vocab: int, eos: int, eot: int):
    engines = []

    class Llama:
        def __init__(self, model_path, **settings):
            self.path, self.settings = model_path, settings
            self.metadata = {"tokenizer.ggml.eot_token_id": str(eot)}
            self.tokens, self.resets, self.ctx = [], 0, self
            self.row = (ctypes.c_float * vocab)()
            engines.append(self)

        def n_vocab(self):
            return vocab

        def token_eos(self):
            return eos

        def reset(self):
            self.resets += 1
            self.tokens = []

        def eval(self, ids):
            self.tokens += list(ids)
            for i in range(vocab):
                self.row[i] = 0.0
            self.row[eos], self.row[eot] = 100.0, 90.0  # the stops are the argmax: they must be banned
            self.row[(self.tokens[-1] + 1) % vocab] = 50.0

    def llama_get_logits_ith(ctx, index):
        assert index == -1
        return ctypes.cast(ctx.row, ctypes.POINTER(ctypes.c_float))

    return SimpleNamespace(Llama=Llama, llama_get_logits_ith=llama_get_logits_ith, __version__="fake"), engines


def test_fixed_length_llama_cpp_loop_bans_every_stop_and_resets_each_prompt():
    tokenizer = tiny_bytelevel_tokenizer()
    eos, eot = tokenizer.eos_token_id, 7
    fake, engines = fake_llama_cpp(len(tokenizer), eos, eot)
    prompts = prompts_from_lines(lines("en", 3), chars=25)
    result = llama_cpp_speeds({"a": ("a.gguf", tokenizer), "b": ("b.gguf", tokenizer)}, prompts, new_tokens=5,
                              llama_cpp=fake, bootstrap={"resamples": 50})  # fmt: skip
    assert [e.path for e in engines] == ["a.gguf", "b.gguf"] and engines[0].settings["logits_all"] is False
    assert all(e.resets == len(prompts) + 1 for e in engines)  # every prompt and the warm-up start from scratch
    for name, own in result["models"].items():
        assert own["generated_tokens"] == 5 * len(prompts) and own["short_generations"] == 0
        for prompt, row in zip(prompts, own["per_prompt"]):
            ids = tokenizer(prompt).input_ids
            assert row["new_ids"] == [(ids[-1] + k) % len(tokenizer) for k in range(1, 6)]  # argmax past the stops
            assert not {eos, eot} & set(row["new_ids"])
        assert own["texts"][0] == tokenizer.decode(own["per_prompt"][0]["new_ids"])
    assert result["models"]["b"]["chars_per_token_ratio"] == 1.0 and result["engine"]["llama_cpp"] == "fake"
