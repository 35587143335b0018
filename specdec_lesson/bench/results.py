"""Benchmark results files: writing them atomically as strict JSON, reading them back with checks (every
field the report uses, by type, named with its row), and the machine / git description every file carries.
The run journal that checkpoints a running benchmark is ``bench.journal``."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

__all__ = ["RESULTS_FORMAT", "JOURNAL_FORMAT", "write_results", "write_text_atomic", "load_results", "machine_info",
           "cpu_model", "latest_gpu_suite", "is_results_file"]

RESULTS_FORMAT = "specdec-bench/1"
JOURNAL_FORMAT = "specdec-bench-journal/1"  # bench.journal


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
    """``{"cpu": model name, "isa": the widest vector extensions, "family"/"model": the CPUID numbers, "kind": a
    name for the machine kind}`` from /proc/cpuinfo (empty where unreadable).  The machines differ (AMD EPYC Zen 3
    with AVX2 only, Zen 4 and Zen 5 with AVX-512, Intel Xeon with AVX-512 and AMX), and so do their speedups; the
    model name alone ("AMD EPYC") does not tell them apart."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}

    def field(key: str) -> str | None:
        return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                     if line.split(":", 1)[0].strip() == key), None)

    flags = set((field("flags") or "").split())
    isa = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if x in flags]
    out = {"cpu": field("model name"), "isa": isa}
    try:
        family, model = int(field("cpu family") or ""), int(field("model") or "")
    except ValueError:
        return out
    out.update(family=family, model=model, kind=_kind(field("vendor_id") or "", family, model, flags))
    return out


def _kind(vendor: str, family: int, model: int, flags: set[str]) -> str | None:
    if vendor == "AuthenticAMD":
        zen = {23: "Zen 2" if model >= 0x30 else "Zen 1", 25: "Zen 4" if model >= 0x10 and model not in range(0x20, 0x60)
               else "Zen 3", 26: "Zen 5"}.get(family)
        return f"AMD {zen}" if zen else None
    if vendor == "GenuineIntel":
        return "Intel with AMX" if "amx_tile" in flags else "Intel"
    return None


def write_results(results: dict, path: str | Path) -> Path:
    """Write JSON atomically (temporary file in the same folder, fsync, rename): a reader sees the
    old file or the whole new one, never a truncated file."""
    return write_text_atomic(path, json.dumps(_clean(results), indent=1, allow_nan=False), "the results file")


def write_text_atomic(path: str | Path, text: str, what: str = "the file") -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync and ``os.replace``: a
    reader (or a crash) sees the old file or the whole new one, never a truncated one."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # name the file, not the temporary one
        raise OSError(exc.errno, f"cannot write {what} {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
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
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a readable JSON results file ({exc})") from None
    if text.lstrip().startswith('{"journal"'):
        raise ValueError(f"{path} is the run journal of an unfinished or killed benchmark run, not a results file: "
                         "report the finished results file (the run's --out) instead")
    try:
        res = json.loads(text)
    except json.JSONDecodeError as exc:
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


def is_results_file(path: str | Path) -> bool:
    """Whether ``path`` is an existing benchmark results file or run journal (complete or not): what an output
    of another kind (the HTML report) must never overwrite."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return f'"{RESULTS_FORMAT}"' in head or f'"{JOURNAL_FORMAT}"' in head


_TASK_ROW_KEYS = ("task", "label", "prompts", "tokens_per_s", "speedup", "speedup_median", "alpha", "tau",
                  "target_forwards_per_token", "accuracy", "pass_at_1", "equal_ar_rate")
_NUMBER_KEYS = ("tokens_per_s", "speedup", "speedup_median", "alpha", "utilisation", "tau", "target_forwards_per_token",
                "accuracy", "pass_at_1", "equal_ar_rate")  # a number or null where report formats them


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _row_problem(row: dict) -> str | None:
    """The first field of a per_task row that ``report`` (table and charts) cannot use, or None."""
    for key in ("task", "label"):
        if not isinstance(row[key], str):
            return f"field {key!r} must be a string, got {row[key]!r}"
    if not isinstance(row["prompts"], int) or isinstance(row["prompts"], bool):
        return f"field 'prompts' must be an integer, got {row['prompts']!r}"
    for key in _NUMBER_KEYS:
        if row.get(key) is not None and not _is_number(row[key]):
            return f"field {key!r} must be a number or null, got {row[key]!r}"
    for key in ("speedup_ci", "speedup_range"):
        v = row.get(key)
        if v and not (isinstance(v, list) and len(v) == 2 and all(_is_number(x) for x in v)):
            return f"field {key!r} must be a [low, high] pair of numbers or null, got {v!r}"
    h = row.get("accept_hist")
    if h is not None and not (isinstance(h, list) and all(_is_number(x) for x in h)):
        return f"field 'accept_hist' must be a list of numbers or null, got {h!r}"
    return None


def _report_problem(res: dict) -> str | None:
    """What a complete results file lacks for ``report`` (table and charts), or None: the first missing field, or
    the first field whose type the report cannot use (named with its row)."""
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
        problem = _row_problem(row)
        if problem:
            return f"per_task row {i} ({row['task']!r}, {row['label']!r}): {problem}"
    if any(not isinstance(lab, dict) or not isinstance(lab.get("label"), str) for lab in res["labels"]):
        return "a 'labels' entry lacks 'label' (a string)"
    if not isinstance(res.get("notes", []), list) or not all(isinstance(n, str) for n in res.get("notes", [])):
        return "its 'notes' is not a list of strings"
    if res.get("git") is not None and not isinstance(res["git"], dict):
        return "its 'git' is not an object"
    gpus = res["machine"].get("gpus")
    if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus)):
        return "its machine's 'gpus' is not a list of strings"
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
