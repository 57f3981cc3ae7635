"""cli.py's domain checks in their rooms: `--scripts` parsed in tokenization/, the expansion's checks in recipes/
(warnings the CLI prints as its own, never an import of the CLI)."""

import warnings

import pytest
from tiny import lines, tiny_source_dir

from vocgraft.corpus import CorpusError


def test_parse_scripts_and_the_expansion_checks():
    from vocgraft.recipes.expand import ExpandError
    from vocgraft.recipes.expansion_checks import check_corpus_scripts, check_heldout_scripts, explain_zero_tokens
    from vocgraft.tokenization.scripts import parse_scripts

    assert (parse_scripts("auto"), parse_scripts("any")) == ("auto", None)
    assert parse_scripts("greek, latin,") == ["GREEK", "LATIN"]
    greek, english = lines("el", 20), lines("en", 20)
    check_corpus_scripts(["GREEK"], greek, "el.txt")
    with pytest.raises(ExpandError, match=r"--scripts DEVANAGARI: the corpus el\.txt has no letters of it"):
        check_corpus_scripts(["DEVANAGARI"], greek, "el.txt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_heldout_scripts(greek, greek, "el.txt", "el-heldout.txt")
        assert not caught
        check_heldout_scripts(greek, english, "el.txt", "en.txt")
    assert len(caught) == 1 and issubclass(caught[0].category, UserWarning)
    message = str(caught[0].message)
    assert message.startswith("--heldout en.txt is in LATIN") and "but --corpus el.txt is in GREEK" in message
    assert "every candidate was skipped (2 because" in explain_zero_tokens({"skipped_reasons": {"script": 2}})


def test_expand_says_the_heldout_warning_before_the_work(tmp_path, capsys, monkeypatch):
    """The recipe room warns; the CLI prints it as its own one-line warning, before the expansion starts."""
    import vocgraft.recipes.expand as expand
    from vocgraft.cli import main

    root = tiny_source_dir(tmp_path, el=lines("el", 30), en=lines("en", 10))

    def stop(*args, **kwargs):
        raise CorpusError("stopped before the work")

    monkeypatch.setattr(expand, "expand_model", stop)
    args = ["expand", "--model", str(root / "source"), "--corpus", str(root / "el.txt"), "--new-tokens", "5"]
    args += ["--init", "mean", "--heldout", str(root / "en.txt"), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    warning = f"vocgraft expand: warning: --heldout {root / 'en.txt'} is in LATIN"
    assert warning in err and err.index(warning) < err.index("stopped before the work")
