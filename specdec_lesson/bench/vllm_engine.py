"""vLLM as the benchmark's peer: methods ``vllm``, ``vllm-ngram`` and ``vllm-eagle`` (``--engine vllm``).

vLLM needs ``transformers<5.20`` and the course pins 5.24, so vLLM lives in its own venv
(``.venv-vllm``, made by ``bash benchmarks/setup_vllm.sh``).  Each vLLM configuration is one
worker process there (``vllm_worker.py``: one ``vllm.LLM``, JSON lines over stdin/stdout), started
once before the warm-up and kept alive, so the native runner interleaves the vLLM methods with its
own exactly as it interleaves its own (for every prompt and repeat, every method once, in a rotated
order).  The same prompt token ids, ``max_new_tokens``, sampling settings, stop tokens and per-call
seeds go to vLLM; the reply's tokens are decoded with the course's tokenizer.

Methods (the vLLM peer of ours in brackets):

* ``vllm`` - plain decoding (``ar``);
* ``vllm-ngram`` - vLLM's n-gram prompt lookup, K drafts, n-grams of ``prompt_lookup_ngram`` down to 1
  tokens (``prompt-lookup``);
* ``vllm-eagle`` - the course's shipped EAGLE draft, exported by ``distill/export_vllm.py`` and run
  by vLLM's EAGLE proposer (``chain``, default pair only).

Fairness on a CPU: vLLM's compute threads are bound to the cores torch uses for our methods
(``VLLM_CPU_OMP_THREADS_BIND=0-(threads-1)`` unless set), and between its calls each worker's
process group is stopped (SIGSTOP; SIGCONT before the next call), so idle vLLM processes take no
CPU time from our methods (``SPECDEC_VLLM_PAUSE=0`` turns that off).  ``wall_s`` is timed by the
runner around the call (JSON transport included, about a millisecond); the worker's own time of
``LLM.generate`` is kept in ``stats["vllm_generate_s"]``.  Acceptance counters come from vLLM's
speculative-decoding metrics, per call: ``accepted``/``proposed`` drafts, ``target_forwards`` =
new tokens - accepted (every target forward emits one token plus its accepted drafts).

Environment: ``SPECDEC_VLLM_PYTHON`` (the vLLM venv's python, default ``<repo>/.venv-vllm/bin/python``),
``VLLM_CPU_KVCACHE_SPACE`` (GiB, default 1 per worker), ``SPECDEC_VLLM_GPU_MEM`` (GPU memory fraction
per worker on CUDA, default 0.8 / (workers + 1)), ``SPECDEC_VLLM_EAGER`` (1: ``enforce_eager``, the
default on a CPU; 0: vLLM's torch.compile and CUDA graphs, the default on CUDA).

On a GPU machine (untested here: no GPU was available)::

    bash benchmarks/setup_vllm.sh --gpu
    python -m specdec_lesson.bench --engine vllm --device cuda --method ar,prompt-lookup,chain --limit 8 --max-new-tokens 96
"""

from __future__ import annotations

import os
from pathlib import Path

from .methods import ENGINES, REGISTRY
from .vllm_process import (  # noqa: F401  (re-exported: the engine's public names)
    _WORKERS,
    LOAD_TIMEOUT_S,
    REPO,
    VllmWorker,
    _cpu_env,
    check_available,
    close_all,
    cpu_problem,
    start_worker,
    vllm_python,
)

__all__ = ["VLLM_METHODS", "PEERS", "vllm_python", "cpu_problem", "check_available", "VllmWorker", "start_worker",
           "check_generate_reply", "prepare", "run_one", "close_all", "peer_methods", "add_vllm_speedups"]



def _vllm_methods() -> tuple[str, ...]:
    """The methods run by vLLM workers (engine "vllm" in methods.REGISTRY), in the table's order."""
    return tuple(name for name, m in REGISTRY.items() if m.engine == "vllm")


def _peers() -> dict[str, str]:
    """Our method -> its vLLM peer (methods.REGISTRY), in the order of the vLLM methods."""
    order = _vllm_methods()
    pairs = [(name, m.vllm_peer) for name, m in REGISTRY.items() if m.vllm_peer in order]
    return dict(sorted(pairs, key=lambda p: order.index(p[1])))


VLLM_METHODS = _vllm_methods()  # as the table holds them at import; the functions below read the table itself
PEERS = _peers()


def _target_path(loaded) -> str:
    pair = (loaded.info or {}).get("pair")
    if pair == "default":
        from ..models import default_target_cache_dir

        return str(default_target_cache_dir())
    if pair == "tiny":
        raise ValueError("the vLLM methods need a model vLLM can load from disk or the hub; the tiny pair exists only "
                         "in memory (use --pair default)")
    return str(loaded.info["target"])


def _dtype(loaded) -> str:
    import torch

    dt = next(loaded.target.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dt, "auto")


def _eos_list(eos) -> list[int]:
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _spec_config(loaded, method: str, k: int | None, s) -> tuple[dict | None, bool]:
    kind = REGISTRY[method].vllm_speculative
    if kind is None:
        return None, False
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": s.prompt_lookup_ngram,
                "prompt_lookup_min": 1}, False
    if kind != "eagle":
        raise ValueError(f"method {method!r}: unknown vLLM speculative method {kind!r} (ngram or eagle)")
    if (loaded.info or {}).get("pair") != "default":
        raise ValueError(f"method {method!r} runs the course's shipped EAGLE draft, which exists for the default pair only")
    from ..distill.export_vllm import ensure_exported

    folder = ensure_exported(loaded.target)
    return {"method": "eagle", "model": str(folder), "num_speculative_tokens": k}, True


def _key(loaded, method: str, k: int | None, s) -> tuple:
    ngram = REGISTRY[method].vllm_speculative == "ngram"
    return (method, k, _target_path(loaded), _dtype(loaded), s.prompt_lookup_ngram if ngram else None)


def prepare(loaded, labels, s) -> None:
    """Start a worker for every vLLM label, in parallel (a live worker of an earlier call with the same
    configuration is reused); any failure raises one line.  Adds a note to ``loaded.notes``."""
    import torch

    wanted = [(m, k) for _, m, k in labels if m in _vllm_methods()]
    if not wanted:
        return
    py = check_available()
    model, dtype = _target_path(loaded), _dtype(loaded)
    device = str(loaded.device)
    env = {} if device.startswith("cuda") else _cpu_env(torch.get_num_threads())
    pause = os.environ.get("SPECDEC_VLLM_PAUSE", "1") != "0"
    eager = os.environ.get("SPECDEC_VLLM_EAGER", "0" if device.startswith("cuda") else "1") != "0"
    for key in [key for key, w in _WORKERS.items() if w.proc.poll() is not None]:
        _WORKERS.pop(key).close()  # died since: start anew
    todo = [(m, k) for m, k in wanted if _key(loaded, m, k, s) not in _WORKERS]
    loads = []
    for m, k in todo:
        spec, custom = _spec_config(loaded, m, k, s)
        extra = {}
        if device.startswith("cuda"):
            extra["gpu_memory_utilization"] = float(os.environ.get("SPECDEC_VLLM_GPU_MEM", 0.8 / (len(todo) + 1)))
        loads.append((m, k, {"model": model, "dtype": dtype, "speculative_config": spec, "seed": s.seed,
                             "max_model_len": 2048, "enforce_eager": eager, "register_specdec_eagle": custom,
                             "extra": extra}))
    workers = [(m, k, VllmWorker(py, env=env, pause=pause, name=f"{m}-k{k}" if k else m), load) for m, k, load in loads]
    try:
        for _, _, w, _ in workers:  # all import vllm and build their engines at the same time
            w.wait_ready()
        for _, _, w, load in workers:
            w.send({"op": "load", **load})
        for _, _, w, load in workers:
            reply = w.receive(LOAD_TIMEOUT_S)
            if not reply.get("ok"):
                raise RuntimeError(f"vLLM refused to start '{w.name}' ({load['model']}, speculative_config="
                                   f"{load['speculative_config']}): {reply.get('error')} (log: {w.log_path})")
            w.info.update(reply)
            w.pause()
    except BaseException:
        for _, _, w, _ in workers:
            w.kill()
        raise
    for m, k, w, _ in workers:
        _WORKERS[_key(loaded, m, k, s)] = w
    used = [_WORKERS[_key(loaded, m, k, s)] for m, k in wanted]
    names = ", ".join(w.name for w in used)
    load_s = ", ".join(f"{w.name} {w.info.get('load_s', 0):.0f} s" for w in used)
    note = (f"vLLM {used[0].info.get('vllm')} methods ({names}): worker processes in {_portable(py.parent.parent)}, "
            f"model {_portable(model)} "
            f"({dtype}), same prompt ids, max_new_tokens, sampling settings and stop tokens; engine load {load_s}")
    if not device.startswith("cuda"):
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"))
        note += f"; VLLM_CPU_OMP_THREADS_BIND={bind}"
    note += "; enforce_eager" if eager else "; torch.compile and CUDA graphs on (enforce_eager off)"
    if pause:
        note += "; idle workers stopped (SIGSTOP) while other methods run"
    loaded.notes.append(note)


def _portable(path) -> str:
    """A path as a results file should record it: relative to the repository, under ``$SPECDEC_CACHE``, or under
    ``~``, so that committed results name no folder of one machine."""
    from ..model_cache import cache_root

    path = Path(path).resolve()
    for base, label in ((REPO, ""), (cache_root().resolve(), "$SPECDEC_CACHE/"), (Path.home().resolve(), "~/")):
        try:
            return label + str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


def run_one(loaded, method: str, k: int | None, ids: list[int], s, seed: int) -> tuple[list[int], dict]:
    """One generation by the vLLM worker of (method, k): (new token ids, stats dict as the runner's)."""
    w = _WORKERS.get(_key(loaded, method, k, s))
    if w is None:
        raise RuntimeError(f"no vLLM worker for {method} k={k}: prepare() was not called")
    req = {"op": "generate", "prompt_token_ids": [int(t) for t in ids], "max_tokens": s.max_new_tokens,
           "temperature": s.temperature, "top_k": s.top_k or None, "top_p": s.top_p, "seed": seed,
           "stop_token_ids": _eos_list(loaded.eos_token_id)}
    reply = w.request(req)
    toks = check_generate_reply(reply, w)
    return toks, _stats(toks, k if REGISTRY[method].takes_k else 0, reply)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_generate_reply(reply: dict, worker) -> list[int]:
    """The new token ids of a worker's ``generate`` reply, after checking its shape (``token_ids``: token ids;
    ``spec``: None or counters; ``wall_s``: seconds); a malformed reply is one RuntimeError naming the worker and
    its log, where the worker wrote what went wrong."""
    def bad(why: str) -> RuntimeError:
        return RuntimeError(f"vLLM worker '{worker.name}' sent a malformed reply to 'generate': {why}; its log may say "
                            f"why (log: {worker.log_path})")

    toks = reply.get("token_ids")
    if not isinstance(toks, list) or not all(_count(t) for t in toks):
        raise bad(f"token_ids must be a list of token ids (integers >= 0), got {str(toks)[:80]!r}")
    spec = reply.get("spec")
    if spec is not None:
        if not isinstance(spec, dict):
            raise bad(f"spec must be null or an object of counters, got {str(spec)[:80]!r}")
        for key in ("drafts", "draft_tokens", "accepted_tokens"):
            if key in spec and not _count(spec[key]):
                raise bad(f"spec.{key} must be an integer >= 0, got {str(spec[key])[:80]!r}")
        per_pos = spec.get("accepted_per_pos")
        if per_pos is not None and (not isinstance(per_pos, list) or not all(_count(v) for v in per_pos)):
            raise bad(f"spec.accepted_per_pos must be a list of integers >= 0, got {str(per_pos)[:80]!r}")
    wall = reply.get("wall_s")
    if wall is not None and (isinstance(wall, bool) or not isinstance(wall, (int, float)) or not wall >= 0):
        raise bad(f"wall_s must be a number of seconds >= 0, got {str(wall)[:80]!r}")
    return toks


def _stats(toks: list[int], k: int, reply: dict) -> dict:
    n = len(toks)
    spec = reply.get("spec") or {}
    acc = int(spec.get("accepted_tokens", 0))
    drafts = int(spec.get("drafts", 0))
    per_pos = list(spec.get("accepted_per_pos") or [])
    hist, rejections = None, 0
    if k and drafts:
        ge = [drafts] + per_pos[:k] + [0] * max(0, k - len(per_pos))  # ge[j]: drafting steps with >= j accepted
        ge.append(0)
        hist = [ge[j] - ge[j + 1] for j in range(k + 1)]
        rejections = drafts - ge[k]  # one rejected draft in every step that did not accept all k
    return {"k": k, "accepted": acc, "rejections": rejections, "proposed": int(spec.get("draft_tokens", 0)),
            "emitted": n, "row_steps": n - acc,
            "target_forwards": n - acc, "draft_forwards": 0, "accept_hist": hist or [],
            "drafting_steps": drafts, "vllm_generate_s": reply.get("wall_s")}


# ------------------------------------------------------------------------- --engine vllm, results
def peer_methods(methods: list[str], explicit: bool) -> list[str]:
    """``--engine vllm``: our methods and their vLLM peers.  Without an explicit ``--method``:
    ar, prompt-lookup, vllm, vllm-ngram; with one: those methods plus the peer of each."""
    if not explicit:
        return ["ar", "prompt-lookup", "vllm", "vllm-ngram"]
    peers, ours = _peers(), _vllm_methods()
    out = list(methods)
    for m in methods:
        peer = peers.get(m)
        if peer and peer not in out:
            out.append(peer)
    if not any(m in ours for m in out):
        pairs = ", ".join(f"{a} -> {b}" for a, b in peers.items())
        raise ValueError(f"--engine vllm: none of {', '.join(methods)} has a vLLM peer ({pairs}); "
                         f"add one of {', '.join(ours)} to --method")
    return out


def add_vllm_speedups(results: dict) -> dict:
    """Add ``speedup_vs_vllm`` (over vLLM's own plain decoding, method ``vllm``) to the tables, paired like
    ``speedup``: each repeat's tokens with its own seconds, over the ``vllm`` run of the same prompt and repeat
    (``bench.paired``)."""
    from .paired import paired_cells, paired_task_speedup, prompt_speedup

    runs = results.get("runs") or []
    cells: dict = {}
    for key in ("per_prompt", "per_task"):
        for r in results.get(key) or []:
            c = cells.setdefault((r["task"], r["label"]), paired_cells(runs, r["task"], r["label"], base="vllm"))
            if key == "per_task":
                r["speedup_vs_vllm"] = paired_task_speedup(c)
            else:
                r["speedup_vs_vllm"] = prompt_speedup(c[r["prompt_id"]]) if r["prompt_id"] in c else None
    if any(r.get("label") == "vllm" for r in results.get("per_task") or []):
        results.setdefault("notes", []).append("speedup_vs_vllm: over vLLM's plain decoding (method vllm), paired by "
                                               "prompt and repeat like speedup; speedup: over our ar, as everywhere")
    return results


ENGINES["vllm"] = run_one  # the runs of the engine-"vllm" methods of methods.REGISTRY go to this module's workers
