import json
import unicodedata

import pytest

from vocgraft.corpus import CorpusError, read_corpus, read_lines, read_mixture, sample_lines


def test_text_file_lines_are_stripped_nfc_and_skip_blanks(tmp_path):
    decomposed = unicodedata.normalize("NFD", "άλφα")
    f = tmp_path / "a.txt"
    f.write_text(f"  one \n\n{decomposed}\n", encoding="utf-8")
    assert read_lines(f) == ["one", "άλφα"]
    assert read_lines(f, normalize=False)[1] == decomposed


def test_folder_reads_every_text_file_in_name_order(tmp_path):
    (tmp_path / "b.txt").write_text("second\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("first\n", encoding="utf-8")
    (tmp_path / "ignored.bin").write_bytes(b"\xff")
    assert read_lines(tmp_path) == ["first", "second"]


def test_jsonl_field(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(["x", "y"])), encoding="utf-8")
    assert read_lines(f, field="body") == ["x", "y"]
    with pytest.raises(CorpusError, match=r"d.jsonl:1: no field 'text'"):
        read_lines(f)


def test_jsonl_bad_json_names_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "ok"}\n{broken\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"d.jsonl:2: not valid JSON"):
        read_lines(f)


def test_missing_file(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        read_lines(tmp_path / "nope.txt")


def test_empty_file(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(CorpusError, match="no text lines"):
        read_lines(f)


def test_empty_folder(tmp_path):
    with pytest.raises(CorpusError, match="has no"):
        read_lines(tmp_path)


def test_non_utf8_names_file_and_line(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("fine\n".encode() + "caf\xe9\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"latin1.txt:2: not valid UTF-8"):
        read_lines(f)


def test_sampling_is_seeded_uniform_and_in_order():
    lines = [str(i) for i in range(1000)]
    a = sample_lines(lines, 50, seed=1)
    assert a == sample_lines(lines, 50, seed=1)
    assert a != sample_lines(lines, 50, seed=2)
    assert len(a) == 50 and a == sorted(a, key=int)
    assert sample_lines(lines[:10], 50) == lines[:10]
    # uniformity: the mean index of many samples is near the middle
    means = [sum(map(int, sample_lines(lines, 20, seed=s))) / 20 for s in range(200)]
    assert abs(sum(means) / len(means) - 499.5) < 25


def test_limit_and_sample_are_exclusive(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("a\nb\nc\n", encoding="utf-8")
    assert read_lines(f, limit=2) == ["a", "b"]
    with pytest.raises(CorpusError, match="not both"):
        read_lines(f, limit=1, sample=1)


def test_hf_dataset_from_local_disk(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["uno", "dos"]})
    ds.save_to_disk(str(tmp_path / "ds"))
    assert read_lines(f"hf:{tmp_path / 'ds'}") == ["uno", "dos"]


def test_mixture_keeps_the_weights_and_is_bounded_by_the_first_corpus_to_run_out(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("".join(f"a{i}\n" for i in range(100)), encoding="utf-8")
    b.write_text("".join(f"b{i}\n" for i in range(1000)), encoding="utf-8")
    mixed = read_mixture([(str(a), 1.0), (str(b), 3.0)])  # a runs out first: 100 lines at share 1/4 -> 400
    assert len(mixed) == 400 and sum(x.startswith("a") for x in mixed) == 100
    assert len(set(mixed)) == 400  # sampled without replacement
    assert mixed[:20] != sorted(mixed[:20])  # shuffled: languages interleave
    assert read_mixture([(str(a), 1.0), (str(b), 3.0)]) == mixed  # seeded
    small = read_corpus([[str(a), 1.0], [str(b), 1.0]], sample=50)
    assert sum(x.startswith("a") for x in small) == 25 and len(small) == 50
    assert read_corpus(str(a)) == read_lines(a)
    with pytest.raises(CorpusError, match=r"a\.txt has 100 lines .* lower --sample"):
        read_mixture([(str(a), 1.0), (str(b), 1.0)], sample=1000)
    with pytest.raises(CorpusError, match="weights must be positive"):
        read_mixture([(str(a), 0.0)])
