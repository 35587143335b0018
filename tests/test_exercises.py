"""The notebooks' exercises: every solution passes its check, every starter and every planted wrong answer fails it,
the statistical checks have the power their docstrings state, and the notebooks' sections follow the registry
(``python -m specdec_lesson.exercises.insert``, idempotent)."""

from __future__ import annotations

import itertools
import json
import linecache
import shutil
from pathlib import Path

import pytest

import specdec_lesson.kernels  # noqa: F401  (TRITON_INTERPRET=1 without CUDA, before the kernel exercises import triton)
from specdec_lesson import pitfalls
from specdec_lesson.exercises import EXERCISES, by_id, check_draft_step, check_verify, insert
from specdec_lesson.exercises._core import LEVEL, detectable_tv

ROOT = Path(__file__).resolve().parents[1]
ALL = [ex for exs in EXERCISES.values() for ex in exs]
_names = itertools.count()


def _triton() -> bool:
    from specdec_lesson.kernels import triton_importable

    return triton_importable()


def run_cell(code: str) -> dict:
    """Execute a cell's code as a notebook would (its source registered in linecache, as IPython does, so that
    ``triton.jit`` can read the kernel's source)."""
    name = f"<exercise-cell-{next(_names)}>"
    linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
    namespace = {"__name__": "__main__"}
    exec(compile(code, name, "exec"), namespace)
    return namespace


def _skip_without_triton(ex_id: str) -> None:
    if ex_id in ("5.2", "5.3") and not _triton():
        pytest.skip("triton is not installed (a course dependency): the Triton exercises need it")


def test_registry_covers_every_notebook():
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(EXERCISES) == notebooks
    assert all(len(exs) >= 2 for exs in EXERCISES.values())
    assert 28 <= len(ALL) <= 36
    ids = [ex.id for ex in ALL]
    assert len(set(ids)) == len(ids)
    for stem, exs in EXERCISES.items():
        assert [ex.id for ex in exs] == [f"{int(stem[:2])}.{m}" for m in range(1, len(exs) + 1)]
        for ex in exs:
            assert ex.check.__name__ in ex.solution and ex.check.__name__ in ex.starter and ex.check.__doc__
            assert "NotImplementedError" not in ex.solution and ex.solution != ex.starter
    assert by_id("4.1").check.__name__ == "check_distinct_rule"
    with pytest.raises(ValueError, match="no exercise '9.9'"):
        by_id("9.9")


def test_modules_by_topic_stay_small():
    for path in (ROOT / "specdec_lesson" / "exercises").glob("*.py"):
        if path.name != "__init__.py":
            assert 60 <= len(path.read_text().splitlines()) <= 350, path.name


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.id)
def test_solution_passes(ex, capsys):
    _skip_without_triton(ex.id)
    run_cell(ex.solution)
    assert f"Exercise {ex.id} passed" in capsys.readouterr().out


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.id)
def test_starter_fails(ex):
    _skip_without_triton(ex.id)
    with pytest.raises(AssertionError, match=f"^Exercise {ex.id}: "):
        run_cell(ex.starter)


# (exercise, what is wrong, text of the solution, its replacement): each one must fail its check
PLANTED = [
    ("0.1", "KV cache left out", "+ batch * (context + 1) * model.kv_bytes_per_token(kv)", ""),
    ("0.1", "whole embedding streamed", "model.streamed_bytes(precision)", "model.weight_bytes(precision)"),
    ("0.2", "last memory-bound batch", "    return hi\n", "    return hi - 1\n"),
    ("0.2", "never None", "        return None\n", "        return max_batch\n"),
    ("0.3", "all heads cached (no GQA)", "model.n_kv_heads", "model.n_heads"),
    ("0.3", "K only, no V", "model.n_layers * 2 *", "model.n_layers *"),
    ("1.1", "q / p", "return min(1, p_x / q_x)", "return min(1, q_x / p_x) if p_x else 0"),
    ("1.1", "unclipped ratio", "return min(1, p_x / q_x)", "return p_x / q_x"),
    ("1.2", "unguarded (p == q: 0 / 0)", "if z > 0 else list(p)", "if True else list(p)"),
    ("1.2", "q - p", "max(0, a - b)", "max(0, b - a)"),
    ("1.2", "not normalised", "[v / z for v in r]", "r"),
    ("1.3", "greedy draft, softmax q (pitfall 1)", "x = torch.multinomial(q, n, replacement=True, generator=generator)",
     "x = q.argmax().expand(n)"),
    ("1.3", "residual from p", "r = r if bool((r > 0).any()) else p ", "r = p"),
    ("1.3", "reseeded inside (pitfall 5)", "    x = torch.multinomial(q, n,",
     "    generator.manual_seed(0)\n    x = torch.multinomial(q, n,"),
    ("1.3", "unguarded residual (pitfall 4)", "r = r if bool((r > 0).any()) else p ", "r = r / r.sum()"),
    ("1.3", "global random state", "u = torch.rand(n, generator=generator, dtype=p.dtype)", "u = torch.rand(n, dtype=p.dtype)"),
    ("1.4", "bonus kept", "- alpha ** k  #", "  #"),
    ("1.4", "alpha = 1 unguarded", "if alpha == 1:", "if False:"),
    ("1.5", "bound halved", "bound += min(pi, qi)", "bound += min(pi, qi) / 2"),
    ("1.5", "E[tau] without tau", "e_tau += i * pr", "e_tau += pr"),
    ("2.1", "q from the raw logits (pitfall 2)", "    return sample_from_probs(q, generator), q",
     "    return sample_from_probs(q, generator), torch.softmax(logits, -1)"),
    ("2.1", "argmax tokens, softmax q (pitfall 1)", "    return sample_from_probs(q, generator), q",
     "    return q.argmax(-1), q"),
    ("2.1", "a fresh generator per call (pitfall 5)", "sample_from_probs(q, generator)",
     "sample_from_probs(q, torch.Generator().manual_seed(0))"),
    ("2.2", "<= in the accept test", "(uniforms * q_x < p_x)", "(uniforms * q_x <= p_x)"),
    ("2.2", "bonus dropped (pitfall 3b)", "    return n, (w / exponentials).argmax(-1)",
     "    y = (w / exponentials).argmax(-1)\n    return n, torch.where(n == K, -1, y)"),
    ("2.2", "argmax bonus (pitfall 3a)", "    return n, (w / exponentials).argmax(-1)",
     "    y = (w / exponentials).argmax(-1)\n    return n, torch.where(n == K, p_n.argmax(-1), y)"),
    ("2.2", "unguarded residual (pitfall 4)", "    w = torch.where((w > 0).any(-1, keepdim=True), w, p_n)",
     "    w = w / w.sum(-1, keepdim=True)"),
    ("2.2", "every passing test counted", ".cumprod(-1).sum(-1)", ".sum(-1)"),
    ("2.3", "utilisation for alpha", "accepted / (accepted + rejections)",
     "accepted / sum(k * sum(h) for k, h in verify_hist.items())"),
    ("2.3", "tau without the emitted token", "(accepted + steps) / steps", "accepted / steps"),
    ("3.1", "crop keeps one rejected slot (pitfall 6)", "return cache_len_before + 1 + n_accepted",
     "return cache_len_before + 1 + n_accepted + (n_accepted < k)"),
    ("3.1", "pending token dropped", "return cache_len_before + 1 + n_accepted", "return cache_len_before + n_accepted"),
    ("3.1", "one too many, always", "return cache_len_before + 1 + n_accepted", "return cache_len_before + 2 + n_accepted"),
    ("3.2", "alpha predicted equal", '"alpha": "lower"', '"alpha": "equal"'),
    ("3.2", "text predicted to change", '"same_text": True', '"same_text": False'),
    ("3.2", "no bug planted", "min(n_accepted, k - 1) + 1", "min(n_accepted, k - 1)"),
    ("3.3", "half-full block freed", "-(-new_length // block_size)", "new_length // block_size"),
    ("3.3", "one block too few freed", "table[keep:]", "table[keep + 1:]"),
    ("3.4", "one counter for the batch (pitfall 7)", "lengths = valid.long().sum(-1)",
     "lengths = torch.full((valid.shape[0],), valid.shape[1])"),
    ("3.4", "positions off by one", "torch.arange(n)[None, :]", "torch.arange(1, n + 1)[None, :]"),
    ("4.1", "residual not updated", "    w[x] = 0 ", "    pass "),
    ("4.1", "not renormalised", "return [v / z for v in w] if z > 0 else list(r)", "return w"),
    ("4.1", "every positive child accepted", "return r[x]  ", "return 1 if r[x] > 0 else 0  "),
    ("4.2", "residual not updated", "w = [max(0, a - b) for a, b in zip(r, q)]", "w = list(r)"),
    ("4.2", "distinct rule's accept", "return min(1, r[x] / q[x])", "return r[x]"),
    ("4.3", "parent only", "mask[i] |= mask[parents[i]]", "mask[i, parents[i]] = True"),
    ("4.3", "no diagonal", "torch.eye(n, dtype=torch.bool)", "torch.zeros(n, n, dtype=torch.bool)"),
    ("4.3", "transposed", "    return mask\n", "    return mask.T\n"),
    ("4.4", "no token of the target's own", "return (1 + sum(values[:n]))", "return (sum(values[:n]))"),
    ("4.4", "root not scored", "(spent + T[n] + overhead)", "(spent + T[max(n - 1, 0)] + overhead)"),
    ("4.4", "never a plain step", "range(len(values) + 1)", "range(1, len(values) + 1)"),
    ("4.4", "every node", "    return max(range(len(values) + 1), key=lambda n: (rate(n), -n))",
     "    return len(values)"),
    ("5.1", "<=", "uniforms * q_x < p_x", "uniforms * q_x <= p_x"),
    ("5.1", "division", "uniforms * q_x < p_x", "uniforms < p_x / q_x"),
    ("5.2", "division in the kernel", "accepted = u * q < p", "accepted = u < p / q"),
    ("5.2", "all passing tests summed", "n = tl.min(tl.where(ok & (accepted == 0), ks, K), axis=0)",
     "n = tl.sum(tl.where(ok & accepted, 1, 0), axis=0)"),
    ("5.3", "no bug left", "accepted = u * q <= p ", "accepted = u * q < p "),
    ("5.3", "a stub, not a planted bug", "    n = tl.min(tl.where(ok & (accepted == 0), ks, K), axis=0)",
     "    n = tl.min(tl.where(ok & (accepted == 0), ks, K), axis=0) * 0"),
    ("5.4", ">= across blocks", "better = v > best", "better = v >= best"),
    ("5.4", "last index on ties inside a block", "i = s.argmax(-1)", "i = s.shape[1] - 1 - s.flip(-1).argmax(-1)"),
    ("6.1", "unreachable goal not None", "    if s(1.0) < goal:\n        return None\n", ""),
    ("6.1", "ideal verify step", "expected_tokens(a, k) / (k * c + verify_ratio)", "expected_tokens(a, k) / (k * c + 1)"),
    ("6.2", "threshold 1.05", "return max(curve) > 1.0", "return max(curve) > 1.05"),
    ("6.2", "max_batch never returned", "    if worth(max_batch):\n        return max_batch\n", ""),
    ("6.3", "the emitted token forgotten", "total, reach = 1.0, 1.0", "total, reach = 0.0, 1.0"),
    ("6.3", "depths not chained", "reach *= a ", "reach = a "),
    ("6.4", "every passing draft counted", ".cumprod(dim=1).sum(dim=1)", ".sum(dim=1)"),
    ("6.4", "reseeded inside", "    u = torch.rand(n_steps, k, generator=generator)",
     "    generator.manual_seed(0)\n    u = torch.rand(n_steps, k, generator=generator)"),
    ("6.4", "global random state", "generator=generator)        # [S, K]", ")        # [S, K]"),
    ("7.1", "free verify step", "curve_ms[k + 1] / curve_ms[1]", "1.0"),
    ("7.1", "T(K) for K drafts", "curve_ms[k + 1] / curve_ms[1]", "curve_ms[k] / curve_ms[1]"),
    ("7.2", "mean of the runs' alphas",
     'accepted = sum(s["accepted"] for s in stats_list)\n'
     '    return accepted / (accepted + sum(s["rejections"] for s in stats_list))',
     'return sum(s["accepted"] / (s["accepted"] + s["rejections"]) for s in stats_list) / len(stats_list)'),
    ("7.2", "utilisation", 'return accepted / (accepted + sum(s["rejections"] for s in stats_list))',
     'return accepted / sum(s["proposed"] for s in stats_list)'),
    ("7.3", "T(K) for K drafts", "curve[k + 1]", "curve[k]"),
    ("7.3", "T(1) for the baseline", "tau * t_baseline /", "tau * curve[1] /"),
    ("8.1", "hard labels", "    p = torch.softmax(teacher_logits, -1)",
     "    p = torch.nn.functional.one_hot(teacher_logits.argmax(-1), teacher_logits.shape[-1])"),
    ("8.1", "weights ignored", "(ce * weight).sum() / weight.sum()", "ce.mean()"),
    ("8.2", "every matching draft counted",
     "        while n < len(drafts) and drafts[n] == tokens[pos + 1 + n]:\n            n += 1\n",
     "        n = sum(d == t for d, t in zip(drafts, tokens[pos + 1:]))\n"),
    ("8.2", "tau without the target's token", "(accepted + steps) / steps", "accepted / steps"),
    ("8.2", "every step a rejection", "rejections += n < len(drafts)", "rejections += 1"),
    ("8.3", "ideal verify step", 'r["c"], dv["verify_ratio"])', 'r["c"], 1.0)'),
    ("8.3", "alpha alone", 'return speedup(r["offline"][kind]["alpha_tok"], dv["k"], r["c"], dv["verify_ratio"])',
     'return r["offline"][kind]["alpha_tok"]'),
]


def test_every_check_has_planted_wrong_answers():
    assert {ex.id for ex in ALL} == {p[0] for p in PLANTED}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a planted division by zero, under Triton's interpreter
@pytest.mark.parametrize("ex_id, what, old, new", PLANTED, ids=[f"{p[0]} {p[1]}" for p in PLANTED])
def test_planted_wrong_answer_fails(ex_id, what, old, new):
    _skip_without_triton(ex_id)
    solution = by_id(ex_id).solution
    assert solution.count(old) == 1, f"the planted bug no longer matches the solution of {ex_id}"
    with pytest.raises(AssertionError, match=f"^Exercise {ex_id}: "):
        run_cell(solution.replace(old, new))


@pytest.mark.parametrize("check, wrong", [
    (check_draft_step, pitfalls.buggy_draft_greedy_softmax_q),
    (check_draft_step, pitfalls.buggy_draft_q_unprocessed),
    (check_verify, pitfalls.buggy_verify_unguarded_from_randoms),
], ids=["pitfall 1", "pitfall 2", "pitfall 4"])
def test_the_library_pitfalls_fail_the_checks(check, wrong):
    with pytest.raises(AssertionError):
        check(wrong)


@pytest.mark.parametrize("n, dof, stated", [(100_000, 5, 0.0112), (40_000, 9, 0.019), (30_000, 26, 0.026),
                                            (50_000, 4, 0.0155)])
def test_stated_power(n, dof, stated):
    """The docstrings' "detects any bias of TV >= d with power 0.99 at level 1e-4" claims hold."""
    assert LEVEL == 1e-4
    assert detectable_tv(n, dof) <= stated
    assert detectable_tv(n, dof) > 0.8 * stated  # and are not loose either


def test_a_failing_learner_function_reads_as_one_assertion():
    from specdec_lesson.exercises import check_residual

    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_residual(lambda p, q: [max(0, a - b) / sum(max(0, x - y) for x, y in zip(p, q)) for a, b in zip(p, q)])
    with pytest.raises(AssertionError, match="expected a function"):
        check_residual(3)


# ------------------------------------------------------------------------------------------------ the insert script
def _copy_notebooks(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return folder


def test_insert_is_idempotent_and_keeps_the_rest(tmp_path, capsys):
    folder = _copy_notebooks(tmp_path)
    for nb in folder.glob("*.ipynb"):  # start from notebooks without a section
        data = json.loads(nb.read_text())
        data["cells"] = [c for c in data["cells"] if insert.TAG not in c.get("metadata", {}).get("tags", [])]
        nb.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    before = {nb.name: json.loads(nb.read_text())["cells"] for nb in folder.glob("*.ipynb")}
    assert insert.main(["--notebooks", str(folder), "--check"]) == 1
    assert insert.main(["--notebooks", str(folder)]) == 0
    first = {nb.name: nb.read_text() for nb in folder.glob("*.ipynb")}
    assert insert.main(["--notebooks", str(folder)]) == 0
    assert {nb.name: nb.read_text() for nb in folder.glob("*.ipynb")} == first  # byte for byte
    assert insert.main(["--notebooks", str(folder), "--check"]) == 0
    for stem, exs in EXERCISES.items():
        cells = json.loads((folder / f"{stem}.ipynb").read_text())["cells"]
        n_old = len(before[f"{stem}.ipynb"])
        assert cells[:n_old] == before[f"{stem}.ipynb"]  # the rest untouched
        section = cells[n_old:]
        assert len(section) == 1 + 2 * len(exs) and "".join(section[0]["source"]).startswith("## Exercises")
        for ex, (md, code) in zip(exs, zip(section[1::2], section[2::2])):
            assert "".join(md["source"]).startswith(f"### Exercise {ex.id}: {ex.title}\n")
            assert "".join(code["source"]) == ex.solution.rstrip("\n") and code["cell_type"] == "code"
    # an executed cell whose source did not change keeps its outputs on a re-run
    path = folder / "01_rejection_sampling.ipynb"
    data = json.loads(path.read_text())
    data["cells"][-1].update(execution_count=7, outputs=[{"name": "stdout", "output_type": "stream", "text": ["ok\n"]}])
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    insert.main(["--notebooks", str(folder)])
    assert json.loads(path.read_text())["cells"][-1]["execution_count"] == 7


def test_insert_writes_starter_workbooks(tmp_path):
    folder, out = _copy_notebooks(tmp_path), tmp_path / "workbook"
    assert insert.main(["--notebooks", str(folder), "--starters", str(out)]) == 0
    cells = json.loads((out / "04_tree_verification.ipynb").read_text())["cells"]
    codes = ["".join(c["source"]) for c in cells if insert.TAG in c.get("metadata", {}).get("tags", [])
             and c["cell_type"] == "code"]
    assert codes == [ex.starter.rstrip("\n") for ex in EXERCISES["04_tree_verification"]]


def test_the_notebooks_carry_the_registry():
    """The committed notebooks' sections are the registry's (re-run the insert script after editing an exercise)."""
    assert insert.main(["--check"]) == 0
