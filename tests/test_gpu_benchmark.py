"""benchmarks/gpu.py is prepared for the one call a lent GPU allows, so it must not rot between loans: its CPU smoke
(tiny random models, every arm: roofline, eval, LAPT trainer and bare loop, distill, VocADT's search; about 20 s)
runs here and every arm must end ok. The bare-loop arms once failed on a changed helper's signature, unseen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


def test_gpu_benchmark_smoke_runs_every_arm(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            "--device",
            "cpu",
            "--distill",
            "--vocadt",
            "--results",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu.json").read_text(encoding="utf-8"))
    failed = {name: arm.get("error") for name, arm in report["arms"].items() if arm["status"] != "ok"}
    assert not failed, failed
    names = set(report["arms"])
    # the trainer and the bare loop are both measured: their ratio is what the LAPT goal is about
    assert any(name.endswith("trainer") for name in names) and any(name.endswith("bare") for name in names), names
    assert any(name.startswith("distill") for name in names) and "vocadt nearest rows" in names, names
    assert (tmp_path / "gpu.md").is_file()
