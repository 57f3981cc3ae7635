"""`vocgraft export gguf`: one .gguf file for llama.cpp."""

from __future__ import annotations

from vocgraft.settings import common as c
from vocgraft.settings.setting import Setting, Stage

OUTTYPE = Setting("outtype", str, "f32", "tensor type (1-D tensors and norms stay f32)",
                  choices=("f32", "f16", "bf16", "q8_0"))  # fmt: skip
EXPORT_GGUF = Stage(
    "export gguf",
    (
        Setting("model", str, None, "a vocgraft output or a Llama/Qwen2 causal-LM directory", required=True),
        c.OUT.but(help="the .gguf file to write"),
        OUTTYPE,
        Setting("text", str, None, "text to measure a refused tokenizer on (default: the output's held-out text, if "
                "its manifest names the corpus)"),
        Setting("force_pre", str, None, "write this llama.cpp pre-tokenizer type although llama.cpp will tokenize "
                "some text differently (the refusal names the nearest type and how much)", metavar="TYPE"),
        c.OVERWRITE.but(help="replace a .gguf file vocgraft wrote"),
    ),
    summary="one .gguf file for llama.cpp, tokenizing exactly as the model's tokenizer does",
)  # fmt: skip
