"""`vocgraft expand` end to end on a tiny model: a directory that plain transformers loads in a fresh process."""

import json

import pytest
from tiny import lines, reload_in_fresh_process, tiny_source_dir

from vocgraft.cli import main


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("expand"), tied=False, el=lines("el", 400))


def expand_args(root, out, init="merge", *extra):
    return [
        "expand",
        "--model",
        str(root / "source"),
        "--corpus",
        str(root / "el.txt"),
        "--new-tokens",
        "30",
        "--init",
        init,
        "--aux-vocab-size",
        "700",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize("init", ["mean", "align"])
def test_expand_saves_a_directory_plain_transformers_loads_and_generates_with(source, tmp_path, init, capsys):
    out = tmp_path / "out"
    assert main(expand_args(source, out, init, "--heldout", str(source / "el.txt"), "--eval-limit", "50")) == 0
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["method"]["init"] == init and manifest["expansion"]["added"] == 30
    assert (manifest["plan"]["new"], manifest["plan"]["copied"]) == (30, 400)
    expansion = json.loads((out / "vocgraft-expansion.json").read_text())
    assert len(expansion["new_tokens"]) == 30
    assert (out / "vocgraft-plan.json").is_file()
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("{") :])
    assert summary["roundtrip_exact"] and summary["tokens_per_line_after"] < summary["tokens_per_line_before"]
    loaded = reload_in_fresh_process(out, max_new_tokens=4)
    assert loaded["rows"] == loaded["len"] == 400 + 30
    assert loaded["tied"] is False and loaded["generated"] == 4
    assert any(i >= 400 for i in loaded["ids"]), "the expanded tokenizer should use a new Greek token"


def test_expand_refuses_to_overwrite_and_leaves_no_half_written_output(source, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    assert main(expand_args(source, out)) == 2
    assert "--overwrite" in capsys.readouterr().err

    import vocgraft.surgery

    def broken(*args, **kwargs):  # fails after the weights and tokenizer were written
        raise RuntimeError("disk full")

    monkeypatch.setattr(vocgraft.surgery, "write_manifest", broken)
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError):
        main(expand_args(source, fresh))
    assert not fresh.exists() and not list(tmp_path.glob(".fresh*"))


def test_expand_rejects_bad_arguments(source, tmp_path, capsys):
    assert (
        main(
            expand_args(source, tmp_path / "o")[:-6]
            + ["--new-tokens", "0", "--init", "mean", "--out", str(tmp_path / "o")]
        )
        == 2
    )
    assert "must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(expand_args(source, tmp_path / "o", "nonsense"))


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_a_family_expansion_cannot_edit_is_refused_before_any_work(tmp_path, capsys, monkeypatch, kind):
    from tiny import tiny_llama, tiny_unigram_tokenizer, tiny_wordpiece_tokenizer

    import vocgraft.recipes.expand as recipe

    tokenizer = tiny_wordpiece_tokenizer() if kind == "wordpiece" else tiny_unigram_tokenizer()
    tiny_llama(len(tokenizer), tied=True).save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    (tmp_path / "el.txt").write_text("\n".join(lines("el", 50)) + "\n", encoding="utf-8")

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the tokenizer family was checked")

    monkeypatch.setattr(recipe, "open_source", loaded)
    assert main(expand_args(tmp_path, tmp_path / "out", "mean")) == 2
    err = capsys.readouterr().err
    assert "cannot expand a" in err and "byte-level BPE" in err and "vocgraft replace" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
