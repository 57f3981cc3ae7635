"""Faults during long work (issue 35), black-box: damaged checkpoints, a run killed after its final rename, two
writers on one folder, a full and a read-only disk, and a repeated GGUF export, each as real `vocgraft` processes
against one source tree.

    python benchmarks/fault_battery.py --src /work/wt-before/src --label before
    python benchmarks/fault_battery.py --src src --label after      # then benchmarks/results/fault_battery.md

No failpoints: every damaged state is made by hand (bytes flipped, files cut or removed, a tmpfs that is full or
read-only, two processes started at once), so a tree from before the failpoints were marked is measured the same
way. Scenario 7b stops the run with `strace` (each rename held 0.3 s after it returns) and SIGKILL as soon as --out
appears, i.e. right after the final rename. 11 and 12 mount a tmpfs (root only); without `mount` they are skipped.

Each tree is compared with its own uninterrupted reference run (the defaults differ between versions: the newer
joins corpus lines with a newline, the older with EOS). A scenario is sorted into

- clean: a one-line error (exit 2) that names what is at fault, or a correct recovery (exit 0, the reference's
  weights); no traceback, nothing left behind;
- silently-wrong-model: exit 0 but the weights differ from the reference's (or are not finite);
- data-loss: a finished output replaced or lost (two writers both "succeeded");
- traceback: a Python traceback on stderr;
- race/unclear: a failure whose message does not say why (or names nothing), or two writers not kept apart;
- leftover: temporary or partial folders, lock files or markers left behind;
- not-reproducible (scenario 10 only): two exports of one model differ in bytes.
- skipped: the scenario could not be set up here (no strace, no mount, an export refused); the note says why.

Everything runs in a temporary folder (removed unless --keep-work); a tree takes about 3-4 minutes on one free core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEP = "step-0000002"  # the one checkpoint the reference keeps (save every 2 of 4 steps)
# the order in which classes win when a scenario has several runs (the worst is reported)
SEVERITY = ["data-loss", "silently-wrong-model", "traceback", "race/unclear", "not-reproducible", "leftover", "clean"]
LEFTOVER_MARKS = ("vocgraft-tmp", ".partial", ".discarded", ".vocgraft-lock.", "finished.json")


# ------------------------------------------------------------------------------------------------ processes
@dataclass
class Run:
    argv: list[str]
    rc: int | None
    stderr: str
    seconds: float
    pid: int = 0
    stdout: str = ""

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    @property
    def last_line(self) -> str:
        return _last(self.stderr)

    def brief(self) -> dict:
        return {"rc": self.rc, "last_line": self.last_line, "stdout_last_line": _last(self.stdout),
                "traceback": self.traceback, "seconds": round(self.seconds, 1), "argv": " ".join(self.argv),
                "stderr_tail": _tail(self.stderr)}  # fmt: skip


def _tail(text: str, lines: int = 12) -> str:
    """The last lines of ``text``, each progress bar as its last redraw (a traceback's end, warnings before an
    error)."""
    kept = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    return "\n".join([line for line in kept if line][-lines:])[-2000:]


def _last(text: str) -> str:
    lines = [part.strip() for part in text.replace("\r", "\n").split("\n")]
    lines = [line for line in lines if line]
    return lines[-1] if lines else ""


class Tree:
    """Runs `python -m vocgraft.cli` of one source tree, with a quiet, offline, one-thread environment."""

    def __init__(self, src: Path):
        self.src = src
        self.env = {k: v for k, v in os.environ.items() if k != "VOCGRAFT_FAILPOINTS"}
        self.env.update(PYTHONPATH=str(src), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")  # fmt: skip

    def argv(self, args: list[str]) -> list[str]:
        return [sys.executable, "-m", "vocgraft.cli", *map(str, args)]

    def start(self, args: list[str], cwd: Path, prefix: list[str] = ()) -> subprocess.Popen:
        return subprocess.Popen([*prefix, *self.argv(args)], cwd=cwd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")  # fmt: skip

    def run(self, args: list[str], cwd: Path, timeout: float = 300) -> Run:
        return self.finish(self.start(args, cwd), args, time.perf_counter(), timeout)

    @staticmethod
    def finish(proc: subprocess.Popen, args: list[str], t0: float, timeout: float = 300) -> Run:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n[fault_battery: killed after {timeout:g} s]"
        return Run([str(a) for a in args], proc.returncode, err, time.perf_counter() - t0, proc.pid, out)

    def together(self, commands: list[list[str]], cwd: Path) -> list[Run]:
        """Start every command at once (no wait between the starts) and wait for all."""
        t0 = time.perf_counter()
        procs = [self.start(args, cwd) for args in commands]
        return [self.finish(p, args, t0) for p, args in zip(procs, commands, strict=True)]


# --------------------------------------------------------------------------------------------- the world
def build_world(work: Path) -> None:
    """work/source: a tiny tied Llama with a byte-level BPE (tests/tiny.py); work/el.txt: 400 Greek lines."""
    code = (
        "import sys; from pathlib import Path; from tiny import tiny_source_dir, lines; "
        "tiny_source_dir(Path(sys.argv[1]), el=lines('el', 400))"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}"}
    subprocess.run([sys.executable, "-c", code, str(work)], env=env, check=True, capture_output=True)


def train_args(work: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--model", work / "source", "--corpus", work / "el.txt", "--out", out, "--strategy", "full",
            "--objective", "clm", "--max-steps", "4", "--save-every", "2", "--seq-len", "32", "--batch-size", "2",
            "--val-lines", "4", "--seed", "0", "--keep-checkpoints", *extra]  # fmt: skip


def weights(folder: Path) -> dict | None:
    from safetensors.numpy import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    tensors = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def compare(out: Path, ref: dict) -> str:
    """'match', 'differ', 'non-finite' or 'missing': the model in ``out`` against the reference's weights."""
    import numpy as np

    try:
        got = weights(out)
    except Exception as exc:  # unreadable weights are a wrong model, not a crash of the battery
        return f"unreadable ({type(exc).__name__})"
    if got is None:
        return "missing"
    if not all(np.isfinite(t).all() for t in got.values() if t.dtype.kind == "f"):
        return "non-finite"
    same = got.keys() == ref.keys() and all(np.array_equal(got[k], ref[k]) for k in ref)
    return "match" if same else "differ"


def leftovers(*folders: Path) -> list[str]:
    found = []
    for folder in folders:
        if folder.exists():
            for path in folder.rglob("*"):
                # every run here keeps its checkpoints (--keep-checkpoints): their run's finished record stays with them
                kept = path.name == "finished.json" and any(path.parent.glob("step-*"))
                if any(mark in path.name for mark in LEFTOVER_MARKS) and not kept:
                    found.append(str(path))
    return sorted(found)


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


# ----------------------------------------------------------------------------------------------- verdicts
@dataclass
class Result:
    id: str
    title: str
    cls: str
    rc: int | None = None
    last_line: str = ""
    traceback: bool = False
    weights: str = ""
    leftovers: list[str] = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0
    runs: list[dict] = field(default_factory=list)


def says(line: str, names: tuple[str, ...]) -> bool:
    return line.startswith("vocgraft") and any(name in line for name in names)


def judge_one(run: Run, *, out: Path, ref: dict, names: tuple[str, ...], scan: tuple[Path, ...],
              must_name_on_success: bool = False) -> tuple[str, str, list[str], str]:  # fmt: skip
    """(class, weights verdict, leftovers, note) of a run that either recovers (exit 0, the reference's weights)
    or refuses with one line naming one of ``names``."""
    left = leftovers(*scan)
    if run.rc == 0:
        verdict = compare(out, ref)
        if verdict != "match":
            return "silently-wrong-model", verdict, left, f"exit 0 with weights: {verdict}"
        if run.traceback:
            return "traceback", verdict, left, "recovered, but printed a traceback"
        if left:
            return "leftover", verdict, left, "recovered"
        if must_name_on_success and not any(name in run.stderr for name in names):
            return "race/unclear", verdict, left, f"recovered without naming {names[0]}"
        return "clean", verdict, left, "recovered: the reference's weights"
    if run.traceback:
        return "traceback", "", left, f"exit {run.rc}"
    if out.exists():
        left = [*left, f"{out} (a failed run's --out)"]
    if left:
        return "leftover", "", left, f"exit {run.rc}"
    if run.rc != 2 or not says(run.last_line, names):
        return "race/unclear", "", left, f"exit {run.rc}; the last line names none of {list(names)}"
    return "clean", "", left, f"refused (exit {run.rc})"


def worst(classes: list[str]) -> str:
    return min(classes, key=SEVERITY.index)


# ---------------------------------------------------------------------------------------------- scenarios
class Battery:
    def __init__(self, tree: Tree, work: Path):
        self.tree, self.work = tree, work
        self.ref_out = work / "ref"
        self.ref: dict = {}

    def reference(self) -> Run:
        run = self.tree.run(train_args(self.work, self.ref_out), self.work)
        if run.rc != 0 or not (self.ref_out.parent / "ref.checkpoints" / STEP).is_dir():
            raise SystemExit(f"fault_battery: the reference run failed (exit {run.rc}):\n{run.stderr[-3000:]}")
        self.ref = weights(self.ref_out)
        return run

    def folder(self, name: str) -> Path:
        path = self.work / name
        path.mkdir()
        return path

    def checkpoint_copy(self, case: Path) -> Path:
        ck = case / "ck"
        ck.mkdir()
        shutil.copytree(self.work / "ref.checkpoints" / STEP, ck / STEP)
        return ck

    # -- 1-6: a damaged copy of the step-2 checkpoint, resumed
    def damaged_resume(self, sid: str, title: str, damage: Callable[[Path], None], names: tuple[str, ...],
                       must_name_on_success: bool = False) -> Result:  # fmt: skip
        case = self.folder(f"s{sid}")
        ck = self.checkpoint_copy(case)
        damage(ck / STEP)
        out = case / "out"
        run = self.tree.run(train_args(self.work, out, "--resume", "--checkpoint-dir", ck), case)
        cls, verdict, left, note = judge_one(run, out=out, ref=self.ref, names=names, scan=(case,),
                                             must_name_on_success=must_name_on_success)  # fmt: skip
        return Result(sid, title, cls, run.rc, run.last_line, run.traceback, verdict, left, note, run.seconds,
                      [run.brief()])  # fmt: skip

    # -- 7a: a finished run (checkpoints kept) resumed again
    def finished_resume(self) -> Result:
        case = self.folder("s7a")
        first = self.tree.run(train_args(self.work, case / "ref"), case)  # the reference's command, in place
        before = digest(case / "ref")
        run = self.tree.run(train_args(self.work, case / "ref", "--resume"), case)
        return self._after_finished("7a", "finished run (--keep-checkpoints) resumed again", case, before,
                                    [first, run], "")  # fmt: skip

    # -- 7b: killed right after the final rename (strace holds each rename; SIGKILL once --out exists)
    def killed_after_rename(self) -> Result:
        title = "killed right after the final rename, then --resume"
        case = self.folder("s7b")
        out = case / "out"
        if not shutil.which("strace"):
            return Result("7b", title, "skipped", note="strace is not installed")
        calls = "rename,renameat,renameat2"
        prefix = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={calls}",
                  "-e", f"inject={calls}:delay_exit=300000"]  # fmt: skip
        args = train_args(self.work, out)
        t0 = time.perf_counter()
        proc = self.tree.start(args, case, prefix)
        killed = False
        while proc.poll() is None:
            if out.is_dir():
                for pid in _descendants(proc.pid):
                    with _quiet():
                        os.kill(pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.005)
        first = self.tree.finish(proc, args, t0)
        if not killed:
            return Result("7b", title, "skipped", first.rc, first.last_line, first.traceback,
                          note="the run ended before the kill (strace could not hold the rename)",
                          runs=[first.brief()])  # fmt: skip
        state = sorted(p.relative_to(case).as_posix() for p in case.rglob("*") if p.parent != out)
        before = digest(out)
        run = self.tree.run(train_args(self.work, out, "--resume"), case)
        result = self._after_finished("7b", title, case, before, [first, run], f"state after the kill: {state}; ")
        return result

    def _after_finished(self, sid: str, title: str, case: Path, before: dict, runs: list[Run], note: str) -> Result:
        run = runs[-1]
        out = Path(str(run.argv[run.argv.index("--out") + 1]))
        verdict = compare(out, self.ref)
        left = leftovers(case)
        if "--keep-checkpoints" in map(str, run.argv):  # kept on request: the checkpoints and their run's record
            kept = Path(f"{out}.checkpoints")
            left = [path for path in left if not Path(path).is_relative_to(kept)]
        changed = out.is_dir() and digest(out) != before
        if not out.is_dir() or verdict != "match":
            cls, why = "data-loss", f"the finished model is {'gone' if not out.is_dir() else verdict}"
        elif run.traceback:
            cls, why = "traceback", f"exit {run.rc}"
        elif run.rc == 0:
            cls, why = ("leftover" if left else "clean"), "exit 0" + (" (--out rewritten)" if changed else "")
        elif "exist" in run.last_line and "finish" not in run.last_line:
            cls, why = "race/unclear", f"exit {run.rc}: refused because --out exists, not that the run finished"
        elif run.rc == 2 and says(run.last_line, ("finish",)):
            cls, why = ("leftover" if left else "clean"), f"exit {run.rc}: says the run finished"
        else:
            cls, why = "race/unclear", f"exit {run.rc}"
        return Result(sid, title, cls, run.rc, run.last_line, run.traceback, verdict, left, note + why,
                      sum(r.seconds for r in runs), [r.brief() for r in runs])  # fmt: skip

    # -- 8: two expands to one --out at once
    def two_expands(self, repeats: int = 3) -> Result:
        verdicts, runs, lasts, left_all = [], [], [], []
        for i in range(repeats):
            case = self.folder(f"s8-{i}")
            out = case / "out"
            args = ["expand", "--model", self.work / "source", "--corpus", self.work / "el.txt", "--new-tokens", "20",
                    "--init", "mean", "--out", out]  # fmt: skip
            pair = self.tree.together([args, args], case)
            runs += [r.brief() for r in pair]
            ok = [r for r in pair if r.rc == 0]
            failed = [r for r in pair if r.rc != 0]
            whole = all((out / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))
            left = leftovers(case)
            left_all += left
            if len(ok) == 2:
                cls = "data-loss"  # the first one's finished output was replaced (or merged) by the second
            elif ok and not whole:
                cls = "data-loss"
            elif any(r.traceback for r in pair):
                cls = "traceback"
            elif len(ok) == 1 and failed[0].rc == 2 and says(failed[0].last_line, (str(out),)):
                cls = "leftover" if left else "clean"
            else:
                cls = "race/unclear"
            verdicts.append(cls)
            lasts.append(failed[0].last_line if failed else "(both exit 0)")
        line = lasts[-1]
        return Result("8", "two `expand` to one --out at once (x3)", worst(verdicts), None, line,
                      any(r["traceback"] for r in runs), "", left_all, "runs: " + ", ".join(verdicts),
                      sum(r["seconds"] for r in runs[::2]), runs)  # fmt: skip

    # -- 9: two resumes of one checkpoint folder at once
    def two_resumes(self) -> Result:
        case = self.folder("s9")
        ck = self.checkpoint_copy(case)
        outs = [case / "out-a", case / "out-b"]
        pair = self.tree.together([train_args(self.work, o, "--resume", "--checkpoint-dir", ck) for o in outs], case)
        ok = [i for i, r in enumerate(pair) if r.rc == 0]
        verdicts = [compare(outs[i], self.ref) for i in ok]
        left = leftovers(case)
        failed = [r for r in pair if r.rc != 0]
        other_pid = {id(r): str(o.pid) for r, o in ((pair[0], pair[1]), (pair[1], pair[0]))}
        if any(v != "match" for v in verdicts):
            cls, note = "silently-wrong-model", f"weights: {verdicts}"
        elif any(r.traceback for r in pair):
            cls, note = "traceback", f"exits {[r.rc for r in pair]}"
        elif len(ok) == 2:
            cls, note = "race/unclear", "both trained from one checkpoint folder at once; no refusal"
        elif len(ok) == 1 and failed[0].rc == 2 and other_pid[id(failed[0])] in failed[0].last_line:
            cls, note = ("leftover" if left else "clean"), "one refused, naming the other's pid"
        else:
            cls, note = "race/unclear", f"exits {[r.rc for r in pair]}; the refusal does not name the other process"
        shown = failed[0] if failed else pair[1]
        return Result("9", "two `train --resume` on one checkpoint folder at once", cls, shown.rc, shown.last_line,
                      any(r.traceback for r in pair), ",".join(verdicts), left, note,
                      max(r.seconds for r in pair), [r.brief() for r in pair])  # fmt: skip

    # -- 10: the same export twice
    def export_twice(self) -> Result:
        case = self.folder("s10")
        runs = [self.tree.run(["export", "gguf", "--model", self.ref_out, "--out", case / f"{n}.gguf"], case)
                for n in ("a", "b")]  # fmt: skip
        title = "`export gguf` twice on one model"
        if any(r.rc != 0 for r in runs):
            bad = next(r for r in runs if r.rc != 0)
            cls = "traceback" if bad.traceback else "skipped"
            return Result("10", title, cls, bad.rc, bad.last_line, bad.traceback,
                          note="the export refused the tiny model", runs=[r.brief() for r in runs])  # fmt: skip
        a, b = (case / "a.gguf").read_bytes(), (case / "b.gguf").read_bytes()
        if a == b:
            cls, note = "clean", f"identical bytes ({len(a)})"
        else:
            cls, note = "not-reproducible", f"bytes differ: {_gguf_difference(case / 'a.gguf', case / 'b.gguf')}"
        left = leftovers(case)
        cls = "leftover" if left and cls == "clean" else cls
        return Result("10", title, cls, 0, runs[-1].last_line, any(r.traceback for r in runs), "", left, note,
                      sum(r.seconds for r in runs), [r.brief() for r in runs])  # fmt: skip

    # -- 11, 12: the --out parent on a full or a read-only tmpfs
    def on_tmpfs(self, sid: str, title: str, size: str, read_only: bool, words: tuple[str, ...]) -> Result:
        case = self.folder(f"s{sid}")
        mnt = case / "mnt"
        mnt.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                                 capture_output=True, text=True)  # fmt: skip
        if mounted.returncode != 0:
            return Result(sid, title, "skipped", note=f"cannot mount a tmpfs: {mounted.stderr.strip()}")
        try:
            if read_only:
                subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)
            out = mnt / "out"
            # the checkpoints go to the ordinary disk: only the final save meets the fault
            run = self.tree.run(train_args(self.work, out, "--checkpoint-dir", case / "ck"), case)
            on_mount = sorted(p.name for p in mnt.iterdir())
            left = [*(str(mnt / n) for n in on_mount), *leftovers(case / "ck")]
        finally:
            subprocess.run(["umount", str(mnt)], capture_output=True)
        named = str(mnt) in run.last_line
        told = any(w in run.last_line.lower() for w in words)
        if run.traceback:
            cls = "traceback"
        elif run.rc == 0:
            cls = "silently-wrong-model"  # nothing can have been saved there
        elif left:
            cls = "leftover"
        elif run.rc == 2 and run.last_line.startswith("vocgraft") and named and told:
            cls = "clean"
        else:
            cls = "race/unclear"
        note = f"exit {run.rc}; names the path: {named}; says why ({'/'.join(words)}): {told}"
        return Result(sid, title, cls, run.rc, run.last_line, run.traceback, "", left, note, run.seconds,
                      [run.brief()])  # fmt: skip


def _descendants(pid: int) -> list[int]:
    """``pid``'s child processes, deepest first (the traced vocgraft under strace)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with _quiet():
            for child in (task / "children").read_text().split():
                found += [*_descendants(int(child)), int(child)]
    return found


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, (OSError, ValueError))


def _gguf_difference(a: Path, b: Path) -> str:
    """Which metadata fields (or tensors) of two GGUF files differ."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return "(gguf not installed)"
    ra, rb = GGUFReader(str(a)), GGUFReader(str(b))

    def fields(reader):
        return {name: bytes(b"".join(bytes(part) for part in f.parts)) for name, f in reader.fields.items()}

    fa, fb = fields(ra), fields(rb)
    keys = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
    tensors = sorted(t.name for t, u in zip(ra.tensors, rb.tensors, strict=False) if bytes(t.data) != bytes(u.data))
    return f"metadata {keys or 'same'}; tensors {tensors or 'same'}"


# ----------------------------------------------------------------------------------------------- damages
def flip(path: Path, at: int, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, min(at + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_middle(path: Path) -> None:
    flip(path, path.stat().st_size // 2)


def flip_safetensors_data(path: Path) -> None:
    """Flip bytes in the middle of the tensor data (past the JSON header): the file still parses."""
    size = path.stat().st_size
    header = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    flip(path, header + (size - header) // 2)


def truncate(path: Path, keep: float) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(int(path.stat().st_size * keep))


def garble_json(path: Path) -> None:
    text = path.read_bytes()
    path.write_bytes(text[: len(text) // 2] + b"\x00}garbled")


# -------------------------------------------------------------------------------------------------- main
def run_battery(tree: Tree, work: Path, only: set[str] | None) -> tuple[list[Result], float]:
    battery = Battery(tree, work)
    t0 = time.perf_counter()
    build_world(work)
    ref_run = battery.reference()
    print(f"reference: exit 0, {ref_run.seconds:.0f} s", file=sys.stderr)
    damages: list[tuple[str, str, Callable[[Path], None], str]] = [
        ("1", "resume: flipped bytes in model.safetensors", flip_safetensors_data, "model.safetensors"),
        ("2", "resume: flipped bytes in optimizer.bin", flip_middle, "optimizer.bin"),
        ("3", "resume: model.safetensors cut to half", lambda f: truncate(f, 0.5), "model.safetensors"),
        ("4", "resume: optimizer.bin of zero bytes", lambda f: truncate(f, 0), "optimizer.bin"),
        ("5", "resume: random_states_0.pkl missing", Path.unlink, "random_states_0.pkl"),
        ("6", "resume: garbled trainer_state.json", garble_json, "trainer_state.json"),
    ]

    def resumed(sid: str, title: str, damage: Callable[[Path], None], name: str) -> Callable[[], Result]:
        # a garbled trainer_state.json must be named even when the run recovers (the wording)
        return lambda: battery.damaged_resume(sid, title, lambda ck: damage(ck / name), (name,), sid == "6")

    scenarios: list[tuple[str, Callable[[], Result]]] = [
        *((sid, resumed(sid, title, damage, name)) for sid, title, damage, name in damages),
        ("7a", battery.finished_resume),
        ("7b", battery.killed_after_rename),
        ("8", battery.two_expands),
        ("9", battery.two_resumes),
        ("10", battery.export_twice),
        ("11", lambda: battery.on_tmpfs("11", "full disk (64 KiB tmpfs) at the final save", "64k", False,
                                        ("space", "full"))),
        ("12", lambda: battery.on_tmpfs("12", "read-only --out parent", "1m", True,
                                        ("read-only", "read only", "not writable", "permission"))),
    ]  # fmt: skip
    results = []
    for sid, scenario in scenarios:
        if only and sid not in only:
            continue
        result = scenario()
        print(f"{sid:>3} {result.cls:<21} exit {result.rc}  {result.last_line[:140]}", file=sys.stderr)
        results.append(result)
    return results, time.perf_counter() - t0


def write_markdown(results_dir: Path) -> Path | None:
    files = {label: results_dir / f"fault_battery-{label}.json" for label in ("before", "after")}
    if not all(f.exists() for f in files.values()):
        return None
    data = {label: json.loads(f.read_text(encoding="utf-8")) for label, f in files.items()}
    before = {r["id"]: r for r in data["before"]["scenarios"]}
    lines = [
        "# Fault battery (issue 35): before and after",
        "",
        f"`python benchmarks/fault_battery.py --src <tree> --label before|after`: before = {data['before']['src']} "
        f"({data['before']['seconds']:.0f} s), after = {data['after']['src']} ({data['after']['seconds']:.0f} s). "
        "Each tree is compared with its own uninterrupted run (train full/clm, 4 steps, checkpoint every 2, "
        "--keep-checkpoints, seed 0, tiny Llama + byte-level BPE, 400 Greek lines). Classes: see the script's "
        "docstring.",
        "",
        "| scenario | before | after | after: last stderr line |",
        "|---|---|---|---|",
    ]
    for r in data["after"]["scenarios"]:
        b = before.get(r["id"], {})
        stdout = r["runs"][-1].get("stdout_last_line", "") if r["runs"] else ""
        message = (r["last_line"] or (f"(stdout) {stdout}" if stdout else "")).replace("|", "\\|")
        after_cls = r["cls"] + (f" ({r['note']})" if r["id"] == "8" else "")
        before_cls = b.get("cls", "-") + (f" ({b['note']})" if r["id"] == "8" and b else "")
        lines.append(f"| {r['id']}. {r['title']} | {before_cls} | {after_cls} | {message} |")
    lines += ["", "## Before: what each scenario printed", ""]
    for r in data["before"]["scenarios"]:
        lines.append(f"- {r['id']}: exit {r['rc']}, weights {r['weights'] or '-'}; {r['note']}; "
                     f"`{r['last_line'][:300]}`" + (f"; left: {r['leftovers']}" if r["leftovers"] else ""))  # fmt: skip
    lines += ["", "## After: details", ""]
    for r in data["after"]["scenarios"]:
        lines.append(f"- {r['id']}: exit {r['rc']}, weights {r['weights'] or '-'}; {r['note']}"
                     + (f"; left: {r['leftovers']}" if r["leftovers"] else ""))  # fmt: skip
    path = results_dir / "fault_battery.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the source tree whose vocgraft runs")
    parser.add_argument("--label", default="after", help="results go to fault_battery-<label>.json")
    parser.add_argument("--only", default="", help="comma-separated scenario ids (1-6, 7a, 7b, 8-12)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the JSON and markdown")
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary folder (printed)")
    args = parser.parse_args()
    src = args.src.resolve()
    if not (src / "vocgraft" / "cli.py").is_file():
        parser.error(f"--src {src} holds no vocgraft/cli.py")
    work = Path(tempfile.mkdtemp(prefix=f"fault-battery-{args.label}-"))
    try:
        results, seconds = run_battery(Tree(src), work, {s for s in args.only.split(",") if s} or None)
    finally:
        if args.keep_work:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            for mnt in work.glob("s*/mnt"):  # never delete through a mount left by an interrupted run
                subprocess.run(["umount", str(mnt)], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    args.results.mkdir(parents=True, exist_ok=True)
    payload = {"label": args.label, "src": str(src), "seconds": round(seconds, 1), "python": sys.executable,
               "scenarios": [asdict(r) for r in results]}  # fmt: skip
    out = args.results / f"fault_battery-{args.label}.json"
    out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{out} ({seconds:.0f} s)", file=sys.stderr)
    md = write_markdown(args.results)
    if md:
        print(md, file=sys.stderr)


if __name__ == "__main__":
    main()
