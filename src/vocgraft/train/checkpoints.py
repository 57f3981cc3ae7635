"""Training checkpoints that are whole or absent, checked before use, and a finished run that stays finished.

A checkpoint ``<root>/step-NNNNNNN`` is written as ``.step-NNNNNNN.partial``: accelerate's files (model, optimizer,
every process's RNG state), the scheduler and ``trainer_state.json``, each synced to disk, then ``checkpoint.json``
listing every file's size and sha256, written last; only then is the folder renamed into place and older
checkpoints removed. ``--resume`` takes the newest checkpoint whose files all match their manifest and holds every
file a resume reads; a damaged one is skipped with a one-line warning (an older whole one is used), and with no whole
one left the run stops naming the damaged file. A checkpoint of an older vocgraft (no ``checkpoint.json``) is used
with a warning that it cannot be verified, after checking that its files are there.

The end of a run: ``finished.json`` is written in the root (where the model goes, and a run id that the saved model's
``vocgraft.json`` carries too) before the model is saved to ``--out``, and is removed last, after the checkpoints.
A run killed between the two is recognised by ``--resume`` as finished (:func:`finished_run`), which removes what is
left instead of refusing because ``--out`` exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from vocgraft import failpoints
from vocgraft.outdir import atomic_write
from vocgraft.train.data import TrainingError

MANIFEST = "checkpoint.json"
STATE_FILE = "trainer_state.json"
SCHEDULER_FILE = "scheduler.pt"
FINISHED = "finished.json"
FORMAT = 1

FILE_WRITTEN = failpoints.register(
    "lapt.checkpoint.file_written", "after each file of a checkpoint is written and synced, before its manifest"
)
BEFORE_RENAME = failpoints.register(
    "lapt.checkpoint.before_rename", "a checkpoint is complete (manifest written) in its .partial folder"
)
AFTER_RENAME = failpoints.register(
    "lapt.checkpoint.after_rename", "a new checkpoint is in place; the older ones are still there"
)
BEFORE_PRUNE = failpoints.register("lapt.checkpoint.before_prune", "before the older checkpoints are removed")


class DamagedCheckpoint(Exception):
    """A checkpoint that must not be loaded: ``file`` is missing, short, altered or unreadable."""

    def __init__(self, file: Path, reason: str):
        super().__init__(f"{file}: {reason}")
        self.file, self.reason = file, reason


@dataclass
class ResumePoint:
    path: Path  # the checkpoint folder
    saved: dict  # its trainer_state.json
    verified: bool  # checked against its manifest (False: an older vocgraft's, without one)


def _sync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (its directory entry reaches the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path, *, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if sync:  # what another process (or accelerate) wrote, flushed from the page cache to the disk
            os.fsync(fh.fileno())
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def seal(partial: Path, step: int, processes: int) -> None:
    """Sync every file of ``partial`` and write its manifest last (synced, with the folder)."""
    listed = {}
    for path in _files(partial):
        if path.name == MANIFEST:
            continue
        digest = _sha256(path, sync=True)
        listed[path.relative_to(partial).as_posix()] = {"bytes": path.stat().st_size, "sha256": digest}
        failpoints.hit(FILE_WRITTEN, path)
    manifest = {"format": FORMAT, "step": step, "processes": processes, "files": listed}
    with open(partial / MANIFEST, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(manifest, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    for folder in {p.parent for p in _files(partial)}:
        _sync_dir(folder)


def publish(partial: Path, final: Path) -> None:
    """Rename the sealed ``partial`` into place (durably), then remove every other checkpoint of the root."""
    failpoints.hit(BEFORE_RENAME, partial)
    if final.exists():  # a damaged checkpoint of this step, skipped by the resume that got here
        discard(final)
    partial.rename(final)
    _sync_dir(final.parent)
    failpoints.hit(AFTER_RENAME, final)
    failpoints.hit(BEFORE_PRUNE, final.parent)
    for old in final.parent.glob("step-*"):
        if old != final:
            discard(old)


def discard(checkpoint: Path) -> None:
    """Remove a checkpoint folder: renamed out of sight first, so a kill halfway through the removal leaves a
    hidden folder (never read, removed later), not a checkpoint with half its files."""
    hidden = checkpoint.with_name(f".{checkpoint.name}.discarded")
    try:
        checkpoint.rename(hidden)
    except OSError:
        hidden = checkpoint
    shutil.rmtree(hidden, ignore_errors=True)


def required_files(processes: int) -> list[str]:
    """What a resume reads besides the model and the optimizer (whose names depend on accelerate's mode)."""
    return [STATE_FILE, SCHEDULER_FILE, *(f"random_states_{i}.pkl" for i in range(processes))]


def _check_required(checkpoint: Path, names: set[str], processes: int) -> None:
    for name in required_files(processes):
        if name not in names:
            raise DamagedCheckpoint(checkpoint / name, "missing")
    tops = {name.split("/")[0] for name in names}
    if not any(top.startswith(("model", "pytorch_model")) for top in tops):
        raise DamagedCheckpoint(checkpoint / "model.safetensors", "missing (no model weights in the checkpoint)")
    # DeepSpeed keeps the optimizer inside its pytorch_model folder; everything else writes optimizer*.bin
    if not any(top.startswith("optimizer") for top in tops) and not any("/" in n for n in names):
        raise DamagedCheckpoint(checkpoint / "optimizer.bin", "missing (no optimizer state in the checkpoint)")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedCheckpoint(path, "missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedCheckpoint(path, f"unreadable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise DamagedCheckpoint(path, f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise DamagedCheckpoint(path, "not a JSON object")
    return data


def verify(checkpoint: Path, processes: int) -> tuple[dict, bool]:
    """(its ``trainer_state.json``, whether it was verified against a manifest) for a checkpoint a resume may load;
    :class:`DamagedCheckpoint` otherwise. Sizes are compared first (cheap), then contents."""
    manifest_path = checkpoint / MANIFEST
    verified = manifest_path.exists()
    if verified:
        manifest = _read_json(manifest_path)
        listed = manifest.get("files")
        if manifest.get("processes", processes) != processes:  # another launch, not damage: no other checkpoint helps
            raise TrainingError(
                f"--resume: {checkpoint} was written by {manifest['processes']} processes and this run has "
                f"{processes}; resume with {manifest['processes']} (each process continues its own random state)."
            )
        if not isinstance(listed, dict) or not listed or not all(isinstance(e, dict) for e in listed.values()):
            raise DamagedCheckpoint(manifest_path, "lists no files, or not as vocgraft writes them")
        _check_required(checkpoint, set(listed), processes)
        for name, entry in listed.items():
            path = checkpoint / name
            if not path.is_file():
                raise DamagedCheckpoint(path, "missing")
            size = path.stat().st_size
            if size != entry.get("bytes"):
                raise DamagedCheckpoint(path, f"{size} bytes where {entry.get('bytes')} were written")
        for name, entry in listed.items():
            if _sha256(checkpoint / name) != entry.get("sha256"):
                raise DamagedCheckpoint(checkpoint / name, "its contents differ from the sha256 written with it")
    else:  # an older vocgraft's: the files must at least be there and not empty
        names = {p.relative_to(checkpoint).as_posix() for p in _files(checkpoint)}
        _check_required(checkpoint, names, processes)
        for name in sorted(names):
            if (checkpoint / name).stat().st_size == 0:
                raise DamagedCheckpoint(checkpoint / name, "empty")
    saved = _read_json(checkpoint / STATE_FILE)
    if not isinstance(saved.get("config"), dict) or not isinstance(saved.get("state"), dict):
        raise DamagedCheckpoint(checkpoint / STATE_FILE, "lacks its config or state")
    return saved, verified


def warn(message: str) -> None:
    print(f"vocgraft: warning: {message}", file=sys.stderr)


def choose(root: Path, processes: int) -> ResumePoint | None:
    """The newest checkpoint under ``root`` that a resume may load, with its trainer state; None when there is none.

    Damaged newer ones are skipped with a warning; when every checkpoint is damaged, a :class:`TrainingError` names
    the newest one's bad file."""
    damaged: list[tuple[Path, DamagedCheckpoint]] = []
    for checkpoint in sorted(root.glob("step-*"), reverse=True):
        if not checkpoint.is_dir():
            continue
        try:
            saved, verified = verify(checkpoint, processes)
        except DamagedCheckpoint as exc:
            damaged.append((checkpoint, exc))
            continue
        for bad, exc in damaged:
            warn(f"checkpoint {bad.name} is damaged ({exc.file}: {exc.reason}); resuming from the earlier "
                 f"{checkpoint} instead.")  # fmt: skip
        if not verified:
            warn(f"checkpoint {checkpoint} has no {MANIFEST} (written by an older vocgraft), so its files cannot be "
                 "verified; resuming from it.")  # fmt: skip
        return ResumePoint(checkpoint, saved, verified)
    if damaged:
        first = damaged[0][1]
        raise TrainingError(
            f"--resume: {first.file} is damaged ({first.reason}) and no earlier checkpoint is whole; delete "
            f"{root} to start over, or restore that file."
        )
    return None


def remove_partials(root: Path) -> None:
    """Folders of checkpoints whose writing (or removal) was cut short: never read, so removed when a run starts or
    saves."""
    for entry in [*root.glob(".step-*.partial"), *root.glob(".step-*.discarded")]:
        shutil.rmtree(entry, ignore_errors=True)


def remove_checkpoints(root: Path) -> None:
    """Remove this run's checkpoints (the finished marker last), and ``root`` if that empties it: a
    ``--checkpoint-dir`` may name a folder that holds other files, which are not ours to delete."""
    for entry in root.glob("step-*"):
        discard(entry)
    remove_partials(root)
    (root / FINISHED).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty (or already gone): leave it
        root.rmdir()


def mark_finished(root: Path, out: str | os.PathLike, run_id: str, settings: dict, keep: bool) -> None:
    """Record, before the final model is renamed into ``out``, that this run ends there (see :func:`finished_run`)."""
    root.mkdir(parents=True, exist_ok=True)
    marker = {"out": str(Path(out).absolute()), "run_id": run_id, "settings": settings, "keep_checkpoints": keep}
    atomic_write(root / FINISHED, json.dumps(marker, default=str) + "\n")


def unmark_finished(root: Path) -> None:
    """The final save failed: drop the marker (and ``root``, when the marker was all it held)."""
    (root / FINISHED).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        root.rmdir()


def finished_run(root: Path, out: str | os.PathLike, settings: dict) -> dict | None:
    """The marker of a run with these settings whose model is complete in ``out`` (its ``vocgraft.json`` carries
    the marker's run id), else None: the run is finished, only the removal of its checkpoints may be left."""
    try:
        marker = json.loads((root / FINISHED).read_text(encoding="utf-8"))
        manifest = json.loads((Path(out) / "vocgraft.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or not isinstance(manifest, dict):
        return None
    same_run = marker.get("run_id") and manifest.get("run_id") == marker.get("run_id")
    if not same_run or marker.get("out") != str(Path(out).absolute()):
        return None
    return marker if json.loads(json.dumps(settings, default=str)) == marker.get("settings") else None
