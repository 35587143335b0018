"""Benchmark results files: writing them atomically as strict JSON, reading them back with checks,
and the machine / git description every file carries."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

__all__ = ["RESULTS_FORMAT", "write_results", "load_results", "machine_info", "cpu_model", "latest_gpu_suite"]

RESULTS_FORMAT = "specdec-bench/1"


def _git_revision() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"revision": None, "dirty": None}
    return {"revision": rev or None, "dirty": bool(dirty)}


def machine_info() -> dict:
    import transformers

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else []}
    info.update(cpu_model())
    return info


def cpu_model() -> dict:
    """``{"cpu": model name, "isa": the widest vector extensions}`` from /proc/cpuinfo (empty where unreadable):
    the machines differ (AMD EPYC with AVX2, Intel Xeon with AVX-512 and AMX), and so do their speedups."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    isa = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if x in flags]
    return {"cpu": name, "isa": isa}


def write_results(results: dict, path: str | Path) -> Path:
    """Write JSON atomically (temporary file in the same folder, fsync, rename): a reader sees the
    old file or the whole new one, never a truncated file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # name the results file, not the temporary one
        raise OSError(exc.errno, f"cannot write the results file {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_clean(results), fh, indent=1, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _clean(obj):
    """NaN/inf -> None, so the file is strict JSON."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def load_results(path: str | Path) -> dict:
    """Read a results file; ValueError if it is not one, or is from an interrupted run."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"results file {str(path)!r} does not exist")
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a readable JSON results file ({exc})") from None
    if not isinstance(res, dict) or res.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path} is not a {RESULTS_FORMAT} results file")
    if res.get("complete") is not True:
        raise ValueError(f"{path} comes from an interrupted run (complete is not true)")
    problem = _report_problem(res)
    if problem:
        raise ValueError(f"{path} is marked complete but {problem}: it cannot be reported (a hand-edited or damaged "
                         "file?); rerun the benchmark to remake it")
    return res


_TASK_ROW_KEYS = ("task", "label", "prompts", "tokens_per_s", "speedup", "speedup_median", "alpha", "tau",
                  "target_forwards_per_token", "accuracy", "pass_at_1", "equal_ar_rate")


def _report_problem(res: dict) -> str | None:
    """What a complete results file lacks for ``report`` (table and charts), or None."""
    for key, kind in (("per_task", list), ("labels", list), ("pair", dict), ("machine", dict), ("settings", dict)):
        if not isinstance(res.get(key), kind):
            return f"has no {key!r} {kind.__name__}" if key not in res else f"its {key!r} is not a {kind.__name__}"
    for key in ("max_new_tokens", "temperature", "repeats"):
        if key not in res["settings"]:
            return f"its settings lack {key!r}"
    for i, row in enumerate(res["per_task"]):
        missing = [k for k in _TASK_ROW_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            return f"per_task row {i} lacks {missing[0]!r}"
    if any(not isinstance(lab, dict) or "label" not in lab for lab in res["labels"]):
        return "a 'labels' entry lacks 'label'"
    return None


def latest_gpu_suite(folder: str | Path | None = None) -> dict | None:
    """The newest committed ``benchmarks/results/gpu_suite_*.json`` written by a real GPU run of
    ``benchmarks/gpu_suite.py`` (dry runs are ignored), or None when none was measured yet."""
    folder = Path(folder) if folder is not None else Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    runs = []
    for path in sorted(folder.glob("gpu_suite_*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not data.get("dry_run") and data.get("suite", "").startswith("specdec gpu_suite"):
            runs.append((data.get("machine", {}).get("date", ""), str(path), data))
    if not runs:
        return None
    _, path, data = max(runs)
    return dict(data, path=path)
