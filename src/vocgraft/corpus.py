"""Reading and sampling text corpora.

A corpus source is one of:
  * a UTF-8 text file, one document per line;
  * a folder: every ``*.txt`` / ``*.jsonl`` file in it, sorted by name;
  * a JSONL file (``.jsonl``): one JSON object per line, the text under ``field`` (default ``"text"``);
  * a Hugging Face ``datasets`` spec ``hf:NAME_OR_PATH[:SPLIT]`` (needs the optional ``datasets`` package).

Lines are NFC-normalised and stripped; empty lines are skipped. Sampling keeps memory at O(sample size)
(reservoir sampling) so a corpus of any size can be streamed, and returns lines in corpus order.
"""

from __future__ import annotations

import json
import os
import random
import stat
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from vocgraft.errors import UserError

TEXT_SUFFIXES = (".txt", ".jsonl")
# a longer line is refused, naming its number: read in bounded pieces, so a file without line breaks (a dump, a
# binary) never fills memory; a document longer than this belongs on several lines
MAX_LINE_BYTES = 1 << 20


# the shared multilingual corpora of this project's machines: ../shared/corpora next to the repository, unless
# VOCGRAFT_CORPORA points elsewhere (the demo and the benchmarks read their defaults from here)
SHARED_CORPORA = Path(os.environ.get("VOCGRAFT_CORPORA") or Path(__file__).resolve().parents[3] / "shared" / "corpora")


class CorpusError(UserError, ValueError):
    """Bad corpus input; the message names the input and what to do."""


def _decode_line(raw: bytes, path: Path, line_no: int) -> str:
    nul = raw.find(b"\x00")
    if nul >= 0:  # valid UTF-8, but no text has it: English in UTF-16 without a BOM is every other byte NUL
        raise CorpusError(
            f"{path}:{line_no}: a NUL byte (byte {nul}); text files have none: this is a binary file, "
            "or UTF-16 text without a byte-order mark (convert it: `iconv -f UTF-16LE -t UTF-8`)."
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{path}:{line_no}: not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 4]!r}). "
            "Convert the file to UTF-8, e.g. `iconv -f LATIN1 -t UTF-8`."
        ) from None


# what a file that is not UTF-8 text usually is, by its first bytes: (magic, what it is, how to convert it); the
# UTF-32 marks come before UTF-16's, whose little-endian mark is their prefix
SIGNATURES = (
    (b"\xff\xfe\x00\x00", "UTF-32 text (little-endian byte-order mark)", "iconv -f UTF-32 -t UTF-8 {p} > {s}"),
    (b"\x00\x00\xfe\xff", "UTF-32 text (big-endian byte-order mark)", "iconv -f UTF-32 -t UTF-8 {p} > {s}"),
    (b"\xff\xfe", "UTF-16 text (little-endian byte-order mark)", "iconv -f UTF-16 -t UTF-8 {p} > {s}"),
    (b"\xfe\xff", "UTF-16 text (big-endian byte-order mark)", "iconv -f UTF-16 -t UTF-8 {p} > {s}"),
    (b"\x1f\x8b", "gzip-compressed", "gunzip -k {p}"),
    (b"BZh", "bzip2-compressed", "bunzip2 -k {p}"),
    (b"\xfd7zXZ\x00", "xz-compressed", "unxz -k {p}"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "unzstd {p}"),
    (b"PK\x03\x04", "a zip archive", "unzip {p}, then pass the text file inside"),
)
UTF8_BOM = b"\xef\xbb\xbf"


# what a path that is neither a regular file nor a folder is, by its stat mode
SPECIAL_FILES = (
    (stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)  # fmt: skip


def check_regular(path: Path, what: str = "corpus") -> None:
    """A local input must be a regular file or a folder: a stream (``/dev/stdin``, a FIFO, a device) is read more
    than once (its first block would be lost) or may never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CorpusError(f"{what} {path} does not exist; check the path.") from None
    for test, kind in SPECIAL_FILES:
        if test(mode):
            raise CorpusError(
                f"{what} {path} is {kind}, not a file: vocgraft reads its inputs more than once, and a stream "
                "loses what was read or never ends; write the stream to a file first (`cat > corpus.txt`) and pass "
                "that file."
            )


def check_plain_text(path: Path) -> None:
    """Refuse a file that is UTF-16/32 or compressed before reading it as UTF-8 lines: the byte-level error would
    otherwise suggest a Latin-1 conversion, which turns such a file into mojibake."""
    check_regular(path, "input")
    with path.open("rb") as fh:
        head = fh.read(8)
    for magic, what, fix in SIGNATURES:
        if head.startswith(magic):
            converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
            raise CorpusError(
                f"{path} is {what}, not UTF-8 text; convert it first: `{fix.format(p=path, s=converted)}`."
            )


def _file_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    check_plain_text(path)
    with path.open("rb") as fh:
        line_no = 0
        while raw := fh.readline(MAX_LINE_BYTES + 1):
            line_no += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise CorpusError(
                    f"{path}:{line_no}: a line longer than {MAX_LINE_BYTES >> 20} MiB; put one document or paragraph "
                    "per line (a line this long is usually a data blob or a file without line breaks)."
                )
            yield line_no, raw[len(UTF8_BOM) :] if line_no == 1 and raw.startswith(UTF8_BOM) else raw


def _iter_text_file(path: Path) -> Iterator[str]:
    for line_no, raw in _file_lines(path):
        yield _decode_line(raw, path, line_no)


def _iter_jsonl_file(path: Path, field: str) -> Iterator[str]:
    for line_no, raw in _file_lines(path):
        text = _decode_line(raw, path, line_no).strip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{line_no}: not valid JSON ({exc.msg}). Each line must be one object.")
        if not isinstance(record, dict) or field not in record:
            raise CorpusError(f"{path}:{line_no}: no field {field!r}; pass the field holding the text (--field NAME).")
        value = record[field]
        if not isinstance(value, str):
            raise CorpusError(f"{path}:{line_no}: field {field!r} is {type(value).__name__}, not a string.")
        yield value


def _iter_hf_dataset(spec: str, field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise CorpusError(
            f"{spec!r} names a Hugging Face dataset, but `datasets` is not installed: pip install 'vocgraft[datasets]'."
        ) from None
    body = spec[len("hf:") :]
    name, _, split = body.partition(":")
    split = split or "train"
    path = Path(name)
    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split]
        else:
            ds = datasets.load_dataset(name, split=split, streaming=True)
    except Exception as exc:  # datasets raises many types; the user needs the spec and the cause
        raise CorpusError(f"could not load dataset {spec!r}: {exc}") from exc
    for row in ds:
        if field not in row:
            raise CorpusError(f"dataset {spec!r} has no column {field!r}; columns: {sorted(row)}. Use --field.")
        yield row[field]


def _files_in(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in TEXT_SUFFIXES)
    if not files:
        raise CorpusError(f"folder {path} has no {' or '.join(TEXT_SUFFIXES)} files; point at a text file instead.")
    return files


def _raw_lines(source: str | Path, field: str) -> Iterator[str]:
    if isinstance(source, str) and source.startswith("hf:"):
        yield from _iter_hf_dataset(source, field)
        return
    path = Path(source)
    check_regular(path)
    for file in _files_in(path) if path.is_dir() else [path]:
        if file.suffix == ".jsonl":
            yield from _iter_jsonl_file(file, field)
        else:
            yield from _iter_text_file(file)


def iter_lines(source: str | Path, *, field: str = "text", normalize: bool = True) -> Iterator[str]:
    """Stream the non-empty, stripped (and NFC-normalised) lines of a corpus source."""
    count = 0
    for text in _raw_lines(source, field):
        # a JSONL/dataset document may hold several lines; we treat each line as one sample
        for line in text.splitlines() or [""]:
            line = line.strip()
            if not line:
                continue
            count += 1
            yield unicodedata.normalize("NFC", line) if normalize else line
    if count == 0:
        raise CorpusError(f"corpus {source} contains no text lines; give a non-empty file.")


def sample_lines(lines: Iterable[str], n: int, seed: int = 0) -> list[str]:
    """Uniform sample of ``n`` lines (all if fewer), in corpus order, deterministic for a seed."""
    if n < 0:
        raise CorpusError(f"sample size must be >= 0, got {n}.")
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        if i < n:
            reservoir.append((i, line))
        else:
            j = rng.randint(0, i)
            if j < n:
                reservoir[j] = (i, line)
    reservoir.sort()
    return [line for _, line in reservoir]


def read_lines(
    source: str | Path,
    *,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    field: str = "text",
    normalize: bool = True,
) -> list[str]:
    """Read a corpus: the first ``limit`` lines, or a seeded uniform ``sample`` of lines (not both)."""
    if limit is not None and sample is not None:
        raise CorpusError("give either limit (first N lines) or sample (random N lines), not both.")
    lines = iter_lines(source, field=field, normalize=normalize)
    if sample is not None:
        return sample_lines(lines, sample, seed)
    if limit is not None:
        if limit <= 0:
            raise CorpusError(f"limit must be positive, got {limit}.")
        out = []
        for line in lines:
            out.append(line)
            if len(out) >= limit:
                break
        return out
    return list(lines)


def read_mixture(
    sources: list[tuple[str, float]],
    *,
    sample: int | None = None,
    seed: int = 0,
    field: str = "text",
) -> list[str]:
    """Lines from several corpora in the proportions of their weights (paper 004 mixes languages this way).

    The mix has ``sample`` lines, or else as many as the corpus that runs out first allows: a weight-w corpus of
    n lines supplies at most n lines of a mix of n / w. Each corpus is sampled without replacement with its own
    seed; the result is shuffled (seeded), so every batch sees every language.
    """
    if not sources:
        raise CorpusError("no corpus given for the mixture.")
    weights = [w for _, w in sources]
    if any(not w > 0 for w in weights):
        raise CorpusError(f"corpus weights must be positive; got {weights}.")
    shares = [w / sum(weights) for w in weights]
    corpora = [read_lines(path, field=field) for path, _ in sources]
    total = sample if sample is not None else int(min(len(lines) / share for lines, share in zip(corpora, shares)))
    mixed: list[str] = []
    for i, ((path, _), lines, share) in enumerate(zip(sources, corpora, shares)):
        want = round(total * share)
        if want > len(lines):
            raise CorpusError(
                f"{path} has {len(lines)} lines but a mix of {total} at weight {share:.3f} needs {want}; "
                "lower --sample or this corpus's weight."
            )
        mixed += sample_lines(lines, want, seed + i)
    random.Random(seed).shuffle(mixed)
    return mixed


def read_corpus(spec: str | list, *, sample: int | None = None, seed: int = 0, field: str = "text") -> list[str]:
    """A corpus spec as stored in training configs: one source, or ``[[source, weight], ...]`` for a mixture."""
    if isinstance(spec, str | Path):
        return read_lines(spec, sample=sample, seed=seed, field=field)
    return read_mixture([(str(path), float(w)) for path, w in spec], sample=sample, seed=seed, field=field)


def corpus_spec(paths: Sequence[str], weights: Sequence[float] | None = None) -> str | list:
    """``--corpus`` (one or more) and ``--corpus-weights`` as the spec :func:`read_corpus` reads: a path, or a
    weighted mix."""
    if weights is None:
        if len(paths) == 1:
            return paths[0]
        return [[path, 1.0] for path in paths]  # several corpora, equal shares
    if len(weights) != len(paths):
        raise CorpusError(f"{len(paths)} corpora but {len(weights)} --corpus-weights; give one weight per corpus.")
    return [[path, weight] for path, weight in zip(paths, weights)]


# a config or a template file is a few KB; a larger one is another file given by mistake (a 2 GB file took a minute
# and 6 GB of memory to be refused as "not valid YAML")
MAX_SMALL_FILE = 16 << 20


def read_utf8(path: str | Path, what: str = "config") -> str:
    """A small text file (a config) as a string; not UTF-8 is named by line and byte, as a corpus would be."""
    path = Path(path)
    check_plain_text(path)
    size = path.stat().st_size
    if size > MAX_SMALL_FILE:
        raise CorpusError(
            f"{path} is {size / 2**20:,.0f} MiB, too large for a {what} file (at most {MAX_SMALL_FILE >> 20} MiB); "
            "check the path."
        )
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_no = data.count(b"\n", 0, exc.start) + 1
        start, end = data.rfind(b"\n", 0, exc.start) + 1, data.find(b"\n", exc.start)
        _decode_line(data[start : len(data) if end < 0 else end], path, line_no)  # raises, naming the line
        raise


def numbered_lines(path: str | Path, expected: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for the non-blank lines of a small structured file (TSV pairs, JSONL records), so its
    parser can name the line it rejects; a missing file says what was ``expected`` in it."""
    path = Path(path)
    if path.exists():
        check_regular(path, "input")
    if path.is_dir():
        raise CorpusError(f"{path} is a folder; give the file of {expected}.")
    if not path.is_file():
        raise CorpusError(f"{path}: no such file; expected {expected}.")
    for number, raw in _file_lines(path):  # line by line, each at most 1 MiB: a 2 GB file fails on its first line
        line = _decode_line(raw, path, number).rstrip("\r\n")
        if line.strip():
            yield number, line
