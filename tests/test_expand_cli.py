"""`vocgraft expand` end to end on a tiny model: a directory that plain transformers loads in a fresh process."""

import json

import pytest
from tiny import lines, reload_in_fresh_process, tiny_source_dir
from transformers import AutoTokenizer

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
    assert main(expand_args(source, fresh)) == 1  # not the user's fault: the traceback, and a request to report it
    assert "RuntimeError: disk full" in capsys.readouterr().err
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


def test_the_init_method_is_chosen_once_with_its_settings_checked_before_any_output(
    source, tmp_path, capsys, monkeypatch
):
    """Preflight resolves --init into the ChosenMethod the recipe runs: a bad setting is refused before --out
    exists, and a run checks the method's settings once (issue 33)."""
    import vocgraft.init.choice as choice

    out = tmp_path / "out"
    assert main(expand_args(source, out, "mean", "--distill-epochs", "1")) == 2
    assert "--distill-epochs is not a setting of init method 'mean'" in capsys.readouterr().err
    assert main(expand_args(source, out, "distill", "--distill-lr", "nan")) == 2
    assert "--distill-lr" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())

    checked = []
    real = choice.method_options
    monkeypatch.setattr(choice, "method_options", lambda *a: checked.append(a[0]) or real(*a))
    assert main(expand_args(source, out, "mean")) == 0
    assert checked == ["mean"]
    assert json.loads((out / "vocgraft.json").read_text())["method"]["init"] == "mean"


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_a_family_expansion_cannot_edit_is_refused_before_any_work(tmp_path, capsys, monkeypatch, kind):
    from tiny import tiny_llama, tiny_unigram_tokenizer, tiny_wordpiece_tokenizer

    import vocgraft.recipes.adapt as recipe

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


# --- SALT in expansion: the target PLM uses the auxiliary tokenizer, whose ids are not the expanded tokenizer's
# ----------------------------------------------------------------------------------------------------------

TINY_FASTTEXT = {"dim": 16, "epochs": 2, "min_count": 3, "threads": 1, "bucket": 20000}  # trains in ~1 s


@pytest.fixture(scope="module")
def salt_inputs(source, tmp_path_factory):
    """An auxiliary tokenizer and a tiny PLM trained with it (`vocgraft tokenizer train`, `vocgraft plm train`)."""
    root = tmp_path_factory.mktemp("salt")
    aux, plm = root / "aux", root / "plm"
    corpus = str(source / "el.txt")
    assert main(["tokenizer", "train", "--corpus", corpus, "--kind", "bytelevel-bpe", "--like", str(source / "source"),
                 "--vocab-size", "700", "--out", str(aux)]) == 0  # fmt: skip
    assert main(["plm", "train", "--corpus", corpus, "--tokenizer", str(aux), "--out", str(plm), "--steps", "3"]) == 0
    return aux, plm


@pytest.mark.parametrize("init", ["salt", "salt-centered"])
def test_expand_with_salt_and_a_plm_trained_with_the_aux_tokenizer(source, salt_inputs, tmp_path, monkeypatch, init):
    import vocgraft.init.focus as focus_module

    monkeypatch.setattr(focus_module, "FASTTEXT_DEFAULTS", TINY_FASTTEXT)  # the paper's 2M x 300 table is slow here
    aux, plm = salt_inputs
    out = tmp_path / "out"
    args = expand_args(source, out, init, "--aux-tokenizer", str(aux), "--target-plm", str(plm))
    assert main(args) == 0
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["inputs"]["target_plm"] == str(plm) and manifest["method"]["init"] == init
    stats = manifest["init_stats"][init.replace("-", "_") + "_stats"]
    assert stats["centered"] == (init == "salt-centered")

    aux_vocab = AutoTokenizer.from_pretrained(aux).get_vocab()
    expanded = AutoTokenizer.from_pretrained(out)
    source_vocab = AutoTokenizer.from_pretrained(source / "source").get_vocab()
    new = {token: i for token, i in expanded.get_vocab().items() if i >= len(source_vocab)}
    assert len(new) == 30
    # the PLM's ids are the aux tokenizer's: reading its rows by target id would take other tokens' rows
    assert sum(aux_vocab.get(token) != i for token, i in new.items()) == 30
    # shared = source tokens that are also aux (PLM) tokens; new tokens are fitted from them by string
    common = {token for token in source_vocab if token in aux_vocab}
    assert stats["shared_with_plm_row"] >= len(common) > 100
    assert stats["queries"] + stats["random_fallback"] + stats["shared_whitespace_insensitive"] == 30
    assert stats["least_squares"] > 10 and stats["anchors"] > 10
    assert stats["no_plm_row"] <= sum(token not in aux_vocab for token in new)  # intermediates the aux lacks
    if init == "salt":  # one fresh-process reload is enough (seconds each)
        loaded = reload_in_fresh_process(out, max_new_tokens=2)
        assert loaded["rows"] == loaded["len"] == 430


def test_expand_with_salt_refuses_without_a_target_plm_before_any_work(source, tmp_path, capsys, monkeypatch):
    import vocgraft.recipes.adapt as adapt_module
    import vocgraft.recipes.expand as expand_module

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the missing input was reported")

    monkeypatch.setattr(adapt_module, "open_source", no_work)
    monkeypatch.setattr(expand_module, "train_aux_tokenizer", no_work)
    out = tmp_path / "out"
    assert main(expand_args(source, out, "salt")) == 2
    err = capsys.readouterr().err
    assert "init method 'salt' needs" in err and "--target-plm" in err
    assert not out.exists()


def test_expand_with_salt_refuses_a_plm_without_the_new_tokens(source, tmp_path, capsys, monkeypatch):
    """A PLM trained with the source tokenizer (not the aux one) has none of the new tokens: one clear line."""
    import vocgraft.init.focus as focus_module

    monkeypatch.setattr(focus_module, "FASTTEXT_DEFAULTS", TINY_FASTTEXT)
    plm = tmp_path / "plm"
    corpus = str(source / "el.txt")
    assert main(["plm", "train", "--corpus", corpus, "--tokenizer", str(source / "source"), "--out", str(plm),
                 "--steps", "1"]) == 0  # fmt: skip
    out = tmp_path / "out"
    assert main(expand_args(source, out, "salt", "--target-plm", str(plm))) == 2
    err = capsys.readouterr().err
    assert "none of the 30 new tokens" in err and "auxiliary tokenizer" in err
    assert not out.exists()
