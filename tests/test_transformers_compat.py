"""Users load vocgraft's outputs with whatever transformers they have, and run vocgraft with the ones it supports.

Two old transformers are checked against the current one (see README, "Supported transformers versions"):
- ``OLDEST_LOAD``: the oldest that loads vocgraft's output directories exactly as the current one does;
- ``OLDEST_RUN``: the oldest vocgraft itself runs with (the floor in pyproject.toml).

Each is pip-installed (``--target``, no dependencies: torch, numpy, safetensors... come from this environment) into
``.venv/compat/transformers-<version>/`` once and reused, and is put first on ``PYTHONPATH`` of a subprocess, where
it shadows the installed transformers. Building them needs PyPI; without it this test fails (it never skips) and
says so.

For the byte-level and SentencePiece families in ``CASES`` (real tokenizers from ../shared/tokenizers around tiny
models), ``vocgraft expand`` and ``vocgraft replace`` run under the current transformers (in this process) and under
``OLDEST_RUN`` (a subprocess); each output is probed (tests/compat_probe.py) in fresh processes under the current
transformers and ``OLDEST_LOAD``: held-out ids, special tokens and their roles, the tokenizer's outputs,
chat-template rendering, model rows/tying and greedy generation must be identical across all four.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tiny import lines

import vocgraft
from vocgraft.checkpoint import ModelLoadError
from vocgraft.cli import main
from vocgraft.corpus import SHARED_CORPORA
from vocgraft.families import family_info, family_source_dir

# pins: tokenizers as each transformers requires (0.20 is the first that reads merges stored as pairs, which every
# tokenizer.json we write has); huggingface_hub < 1 as 4.x requires
OLDEST_LOAD = {"transformers": "4.45.2", "tokenizers": "0.20.3", "huggingface_hub": "0.36.2"}
OLDEST_RUN = {"transformers": "4.47.1", "tokenizers": "0.21.4", "huggingface_hub": "0.36.2"}
OLDEST_RUN_VERSION = tuple(int(x) for x in OLDEST_RUN["transformers"].split(".")[:2])
REPO = Path(__file__).resolve().parents[1]
ENVS = REPO / ".venv" / "compat"
SRC = Path(vocgraft.__file__).resolve().parents[1]  # the vocgraft under test, also in the subprocesses
PROBE = Path(__file__).with_name("compat_probe.py")
# family -> (tokenizer kind replace trains, modes). GPT-2: byte-level BPE, tied like SmolLM2; Llama-2: SentencePiece
# BPE with byte fallback, untied, chat template; Phi-3: its chat markers and placeholders are special added tokens
# the target tokenizer lacks, which replace carries over with the source's layout
CASES = {"gpt2": ("bytelevel-bpe", ("expand", "replace")), "llama2": ("sp-bpe", ("expand", "replace"))}
CASES["phi3"] = ("sp-bpe", ("replace",))
PAIRS = [(family, mode) for family, (_, modes) in sorted(CASES.items()) for mode in modes]
HELDOUT_LINES = 40
VERSIONS = "import json, tokenizers as t, transformers as tf; print(json.dumps([tf.__version__, t.__version__]))"
# `vocgraft ARGS` for each ARGS of a JSON list in one process; the exit status is the worst of them
CLI_EACH = "import json, sys; from vocgraft.cli import main; sys.exit(max(main(a) for a in json.loads(sys.argv[1])))"


def _run(args: list[str], env_dir: Path | None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in a fresh process: current transformers, or the one in ``env_dir`` shadowing it."""
    env = dict(os.environ)
    paths = ([str(env_dir)] if env_dir else []) + [str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)


def build_env(pins: dict[str, str]) -> Path:
    """``.venv/compat/transformers-<version>`` with ``pins`` installed, built once (atomically) and then reused;
    checked to shadow the installed transformers."""
    target = ENVS / f"transformers-{pins['transformers']}"
    if not (target / ".complete").is_file():
        ENVS.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=ENVS))
        specs = [f"{name}=={version}" for name, version in pins.items()]
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
        command += ["--target", str(tmp), *specs]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess(command, -1, "", "pip did not finish in 600 s")
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.fail(
                f"could not build the transformers {pins['transformers']} environment in {target} "
                f"(this test needs PyPI the first time): `{' '.join(command)}` failed:\n{done.stderr[-3000:]}"
            )
        shutil.rmtree(target, ignore_errors=True)  # a half-built one from an interrupted run
        os.replace(tmp, target)
        (target / ".complete").write_text(" ".join(specs) + "\n", encoding="utf-8")
    done = _run(["-c", VERSIONS], target)
    assert done.returncode == 0, f"transformers {pins['transformers']} in {target} does not import:\n{done.stderr}"
    found = dict(zip(("transformers", "tokenizers"), json.loads(done.stdout)))
    assert found == {k: pins[k] for k in found}, f"{target} does not shadow the installed transformers: {found}"
    return target


@pytest.fixture(scope="module")
def envs() -> dict[str, Path | None]:
    """'current' (None: this environment), 'load' (OLDEST_LOAD) and 'run' (OLDEST_RUN)."""
    import transformers

    assert transformers.__version__ not in (OLDEST_LOAD["transformers"], OLDEST_RUN["transformers"])
    return {"current": None, "load": build_env(OLDEST_LOAD), "run": build_env(OLDEST_RUN)}


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compat-text")
    with open(SHARED_CORPORA / "el" / "heldout.txt", encoding="utf-8") as fh:
        heldout = [line.rstrip("\n") for line in fh if line.strip()][:HELDOUT_LINES]
    (root / "train.txt").write_text("\n".join(lines("el", 400)) + "\n", encoding="utf-8")
    (root / "heldout.txt").write_text("\n".join(heldout) + "\n", encoding="utf-8")
    return {"train": root / "train.txt", "heldout": root / "heldout.txt"}


def _vocgraft_args(family: str, mode: str, source: Path, corpus: Path, out: Path) -> list[str]:
    common = ["--model", str(source), "--corpus", str(corpus), "--init", "mean", "--out", str(out)]
    if mode == "expand":
        return ["expand", *common, "--new-tokens", "30", "--aux-vocab-size", "700"]
    return ["replace", *common, "--kind", CASES[family][0], "--vocab-size", "600"]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, envs, texts) -> dict[tuple[str, str, str], Path]:
    """(family, mode, 'current' or 'run': the transformers vocgraft ran under) -> output directory."""
    root = tmp_path_factory.mktemp("compat")
    made, under_oldest = {}, []
    for family in sorted(CASES):
        source = family_source_dir(family, root / family / "source")
        for mode in CASES[family][1]:
            made[(family, mode, "current")] = root / family / f"{mode}-current"
            assert main(_vocgraft_args(family, mode, source, texts["train"], made[(family, mode, "current")])) == 0
            made[(family, mode, "run")] = root / family / f"{mode}-run"
            under_oldest.append(_vocgraft_args(family, mode, source, texts["train"], made[(family, mode, "run")]))
    done = _run(["-c", CLI_EACH, json.dumps(under_oldest)], envs["run"])  # one process: torch is imported once
    assert done.returncode == 0, (
        f"vocgraft under transformers {OLDEST_RUN['transformers']} failed:\n{done.stderr[-3000:]}"
    )
    return made


@pytest.fixture(scope="module")
def probes(outputs, envs, texts) -> dict[tuple[str, str, str, str], dict]:
    """(family, mode, made under, read by 'current' or 'load') -> what tests/compat_probe.py found there."""
    keys = {str(path): key for key, path in outputs.items()}
    found = {}
    for read_by in ("current", "load"):
        done = _run([str(PROBE), str(texts["heldout"]), *keys], envs[read_by])
        assert done.returncode == 0, f"loading the outputs under {read_by} transformers failed:\n{done.stderr[-3000:]}"
        for folder, result in json.loads(done.stdout.strip().splitlines()[-1]).items():
            found[(*keys[folder], read_by)] = result
    return found


def _by_runner(probes: dict, family: str, mode: str) -> dict[tuple[str, str], dict]:
    """(made under, read by) -> probe, for one family and mode."""
    return {
        (made, read): probes[(family, mode, made, read)] for made in ("current", "run") for read in ("current", "load")
    }


@pytest.mark.parametrize("family,mode", PAIRS)
def test_outputs_load_identically_in_the_oldest_and_current_transformers(probes, texts, family, mode):
    info = family_info(family)
    heldout = texts["heldout"].read_text(encoding="utf-8").splitlines()
    for (made_by, read_by), found in _by_runner(probes, family, mode).items():
        assert "error" not in found, f"{family} {mode} made under {made_by}, read by {read_by}: {found['error']}"
    reference = probes[(family, mode, "current", "current")]
    assert probes[(family, mode, "current", "load")]["transformers"] == OLDEST_LOAD["transformers"]
    # the reference is what the output should be, so that agreeing with it means something
    assert reference["roundtrip"] == heldout
    assert info["eos"] in reference["special_tokens"] and reference["roles"]["eos_token"][0] is not None
    if mode == "expand":
        assert reference["roles"]["eos_token"][0] == info["eos"]
        assert max(max(ids) for ids in reference["ids"]) >= info["tokenizer_length"], "no new token is used"
    assert reference["input_names"] == ["attention_mask", "input_ids"]
    assert reference["tied"] is info["tie_word_embeddings"] and reference["rows"] >= reference["length"]
    assert len(reference["generated"]) > 0
    assert (reference["chat"] is not None) is info["chat_template"]
    if (family, mode) == ("phi3", "replace"):  # the source's chat markers are special added tokens, not a role's
        assert {("<|end|>", True), ("<|assistant|>", True)} <= {tuple(t) for t in reference["added_tokens"].values()}
    for (made_by, _), found in _by_runner(probes, family, mode).items():
        differing = sorted(k for k in reference if k != "transformers" and found.get(k) != reference[k])
        assert not differing, (
            f"{family} {mode}: the output vocgraft made under {made_by} transformers, read by transformers "
            f"{found['transformers']}, differs from the current one in {differing}, e.g. {differing[0]}: "
            f"{str(found.get(differing[0]))[:300]} != {str(reference[differing[0]])[:300]}"
        )


def test_saved_tokenizer_config_uses_keys_every_version_reads(tmp_path):
    """The rewrite itself (fast; the loading is checked above): a tokenizer with extra special tokens and a chat
    template, saved by the current transformers, names them the way 4.x reads them and reloads unchanged here."""
    from tiny import tiny_sp_tokenizer
    from transformers import AutoTokenizer

    from vocgraft.compat import add_extra_special_tokens
    from vocgraft.tokenization.portable import save_portable

    tokenizer = tiny_sp_tokenizer()
    add_extra_special_tokens(tokenizer, ["<|user|>", "<|end|>"])
    tokenizer.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
    save_portable(tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["additional_special_tokens"] == ["<|user|>", "<|end|>"] and "extra_special_tokens" not in config
    assert config["chat_template"] == (tmp_path / "chat_template.jinja").read_text(encoding="utf-8")
    assert config["model_input_names"] == ["input_ids", "attention_mask"]
    assert not {"is_local", "local_files_only", "auto_map"} & set(config)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert {"<|user|>", "<|end|>"} <= set(loaded.all_special_tokens)
    messages = [{"role": "user", "content": "Η γλώσσα"}]
    assert loaded.apply_chat_template(messages, tokenize=False) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )
    assert sorted(loaded("Η γλώσσα").keys()) == ["attention_mask", "input_ids"]


def test_gguf_conversion_under_an_older_transformers_is_a_clear_error(tmp_path, monkeypatch):
    """Before 5.18 transformers converts SmolLM2's GGUF tokenizer with the wrong eos: refuse rather than adapt a
    model whose tokenizer is wrong; a directory converted by a newer version is still used."""
    from vocgraft import compat, models

    monkeypatch.setenv("VOCGRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(compat, "transformers_version", lambda: OLDEST_RUN_VERSION)
    with pytest.raises(ModelLoadError, match=r"needs transformers >= 5\.18.*Hugging Face model directory"):
        models.resolve("smollm2")
    converted = models.converted_dir(models.file_sha256(models.alias_path("smollm2")))
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}", encoding="utf-8")
    assert models.resolve("smollm2") == str(converted)
