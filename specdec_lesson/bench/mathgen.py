"""Generated grade-school math word problems with verified answers (the benchmark's ``math`` task).

Made by this module, with no download and no model involved:

* 12 story templates (shopping change, packing boxes, a two-leg trip, saving up, ages,
  a sale price, fencing a garden, scaling a recipe, regrouping a class, weekly pay with
  overtime, filling a leaking tank, reading a book faster each day).  Each template has a
  varied pool of names and objects.
* Numbers are drawn from ``random.Random`` seeded by the template name (no global state),
  under constraints that keep every answer a positive integer (e.g. the price is a multiple
  of 20 when the discount is a multiple of 5%).
* The answer is computed in Python from the same numbers (``solve``), and then verified by a
  second, independent computation (``check``): a step-by-step simulation (counting boxes
  one at a time, paying item by item, filling the tank minute by minute), exact rational
  arithmetic with ``fractions.Fraction``, or plugging the answer back into the story's
  conditions.  A problem whose two computations disagree raises at build time, so no
  unverified answer can be returned; ``tests/test_bench.py`` recomputes them again.
* Questions are de-duplicated.  For each template the first ``MATH_EVAL_PER_TEMPLATE``
  distinct problems form the ``eval`` split (96 problems) and the next ones the ``train``
  split.  Templates marked ``held_out`` (the last four) appear in ``eval`` only, so the
  benchmark also measures a draft on stories it was never trained on.  The splits are
  disjoint by construction.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["MATH_EVAL_PER_TEMPLATE", "MATH_TRAIN_PER_TEMPLATE", "NAMES", "math_problems"]

MATH_EVAL_PER_TEMPLATE = 8
MATH_TRAIN_PER_TEMPLATE = 30
NAMES = ["Maya", "Leo", "Aisha", "Tom", "Priya", "Carlos", "Mei", "Jonas", "Fatima", "Noah", "Sofia", "Kenji", "Amara", "Ivan"]


@dataclass(frozen=True)
class _Template:
    name: str
    draw: Callable[[random.Random], dict]  # numbers (and words) for one story
    text: Callable[[dict], str]
    solve: Callable[[dict], int]  # the answer, computed directly
    check: Callable[[dict, int], bool]  # an independent check of that answer
    held_out: bool = False


def _shopping(r):
    a, b = r.randint(2, 9), r.randint(2, 9)
    p, q = r.randint(2, 15), r.randint(1, 6)
    cost = a * p + b * q
    bill = next(x for x in (20, 50, 100, 200) if x > cost)
    return dict(n=r.choice(NAMES), item=r.choice(["notebooks", "apples", "stickers", "candles"]),
                item2=r.choice(["pens", "oranges", "erasers", "cards"]), a=a, b=b, p=p, q=q, bill=bill)


def _shopping_check(d, ans):
    left = d["bill"]
    for _ in range(d["a"]):
        left -= d["p"]
    for _ in range(d["b"]):
        left -= d["q"]
    return left == ans


def _boxes(r):
    return dict(n=r.choice(NAMES), fruit=r.choice(["apples", "pears", "peaches", "lemons"]),
                per=r.randint(12, 60), trees=r.randint(3, 15), box=r.choice([6, 8, 10, 12, 15, 24]))


def _boxes_check(d, ans):
    boxes = loose = 0
    for _ in range(d["trees"] * d["per"]):
        loose += 1
        if loose == d["box"]:
            boxes, loose = boxes + 1, 0
    return boxes == ans


def _trip(r):
    return dict(n=r.choice(NAMES), vehicle=r.choice(["train", "bus", "car", "ferry"]),
                v=r.randint(4, 24) * 5, h=r.randint(1, 5), w=r.randint(4, 24) * 5, g=r.randint(1, 4))


def _savings(r):
    a, b = r.randint(3, 25), r.randint(0, 40)
    goal = b + r.randint(2, 20) * a + r.randint(0, a - 1) + 1
    return dict(n=r.choice(NAMES), thing=r.choice(["a bike", "a guitar", "a tent", "a telescope"]), a=a, b=b, goal=goal)


def _savings_check(d, ans):
    money, weeks = d["b"], 0
    while money < d["goal"]:
        money, weeks = money + d["a"], weeks + 1
    return weeks == ans


def _ages(r):
    n1, n2 = r.sample(NAMES, 2)
    ben, x, y = r.randint(3, 30), r.randint(1, 25), r.randint(2, 15)
    return dict(n1=n1, n2=n2, x=x, y=y, s=(ben + x + y) + (ben + y))


def _sale(r):
    return dict(n=r.choice(NAMES), thing=r.choice(["jacket", "lamp", "backpack", "pair of shoes"]),
                p=r.randint(2, 25) * 20, d=r.randint(1, 15) * 5)


def _fence(r):
    return dict(n=r.choice(NAMES), l=r.randint(5, 40), w=r.randint(3, 30), c=r.randint(2, 12))


def _fence_check(d, ans):
    return sum([d["l"], d["w"], d["l"], d["w"]]) * d["c"] == ans


def _recipe(r):
    c = r.choice([6, 8, 10, 12, 20, 24])
    return dict(n=r.choice(NAMES), food=r.choice(["cookies", "muffins", "pancakes", "biscuits"]),
                e=r.randint(1, 5), c=c, k=r.randint(2, 9) * c)


def _classroom(r):
    g, s, t = r.randint(3, 8), r.randint(4, 9), r.choice([3, 4, 5, 6])
    a = r.randint(2, 6)
    total = g * s - a
    b = (-total) % t + t * r.randint(0, 2) or t  # joiners so that the final count splits evenly
    return dict(n=r.choice(NAMES), g=g, s=s, a=a, b=b, t=t)


def _classroom_check(d, ans):
    students = [1] * (d["g"] * d["s"])
    del students[: d["a"]]
    students += [1] * d["b"]
    return len(students) % d["t"] == 0 and len(students) // d["t"] == ans


def _wages(r):
    return dict(n=r.choice(NAMES), r=r.randint(5, 20) * 2, h=r.randint(3, 8), k=r.randint(2, 6))


def _tank(r):
    f, leak = r.randint(5, 20), r.randint(1, 4)
    return dict(f=f, l=leak, c=(f - leak) * r.randint(5, 40)) if f > leak else _tank(r)


def _tank_check(d, ans):
    level = minutes = 0
    while level < d["c"]:
        level, minutes = level + d["f"] - d["l"], minutes + 1
    return minutes == ans and level == d["c"]


def _reading(r):
    return dict(n=r.choice(NAMES), p=r.randint(80, 600), a=r.randint(5, 30), d=r.randint(1, 8))


def _reading_solve(d):
    # smallest n with n*a + d*n*(n-1)/2 >= p, from the quadratic formula, then nudged to be exact
    a, inc, p = d["a"], d["d"], d["p"]
    n = max(1, math.ceil((-(2 * a - inc) + math.sqrt((2 * a - inc) ** 2 + 8 * inc * p)) / (2 * inc)))
    while n * a + inc * n * (n - 1) // 2 < p:
        n += 1
    while n > 1 and (n - 1) * a + inc * (n - 1) * (n - 2) // 2 >= p:
        n -= 1
    return n


def _reading_check(d, ans):
    read, today, days = 0, d["a"], 0
    while read < d["p"]:
        read, today, days = read + today, today + d["d"], days + 1
    return days == ans


_TEMPLATES = [
    _Template("shopping", _shopping,
              lambda d: f"{d['n']} buys {d['a']} {d['item']} for ${d['p']} each and {d['b']} {d['item2']} for ${d['q']} each. "
                        f"{d['n']} pays with a ${d['bill']} bill. How many dollars of change does {d['n']} get?",
              lambda d: d["bill"] - (d["a"] * d["p"] + d["b"] * d["q"]), _shopping_check),
    _Template("boxes", _boxes,
              lambda d: f"{d['n']} picks {d['per']} {d['fruit']} from each of {d['trees']} trees and packs them into boxes "
                        f"that hold {d['box']} {d['fruit']} each. How many boxes can {d['n']} fill completely?",
              lambda d: d["per"] * d["trees"] // d["box"], _boxes_check),
    _Template("trip", _trip,
              lambda d: f"{d['n']}'s {d['vehicle']} travels at {d['v']} km per hour for {d['h']} hours, then at {d['w']} km "
                        f"per hour for {d['g']} more hours. How many kilometers does it travel in total?",
              lambda d: d["v"] * d["h"] + d["w"] * d["g"],
              lambda d, ans: sum([d["v"]] * d["h"] + [d["w"]] * d["g"]) == ans),
    _Template("savings", _savings,
              lambda d: f"{d['n']} wants to buy {d['thing']} that costs ${d['goal']}. {d['n']} already has ${d['b']} and saves "
                        f"${d['a']} every week. How many weeks does {d['n']} need to save to have enough money?",
              lambda d: -(-(d["goal"] - d["b"]) // d["a"]), _savings_check),
    _Template("ages", _ages,
              lambda d: f"{d['n1']} is {d['x']} years older than {d['n2']}. In {d['y']} years, the sum of their ages will be "
                        f"{d['s']}. How old is {d['n2']} now?",
              lambda d: (d["s"] - d["x"] - 2 * d["y"]) // 2,
              lambda d, ans: ans > 0 and (ans + d["x"] + d["y"]) + (ans + d["y"]) == d["s"]),
    _Template("sale", _sale,
              lambda d: f"A {d['thing']} costs ${d['p']}. {d['n']} buys it during a sale at {d['d']}% off. "
                        f"How many dollars does {d['n']} pay?",
              lambda d: d["p"] * (100 - d["d"]) // 100,
              lambda d, ans: Fraction(d["p"]) - Fraction(d["p"]) * Fraction(d["d"], 100) == ans),
    _Template("fence", _fence,
              lambda d: f"{d['n']}'s garden is a rectangle {d['l']} meters long and {d['w']} meters wide. Fencing costs "
                        f"${d['c']} per meter. How many dollars does it cost to fence the whole garden?",
              lambda d: 2 * (d["l"] + d["w"]) * d["c"], _fence_check),
    _Template("recipe", _recipe,
              lambda d: f"A recipe uses {d['e']} eggs to make {d['c']} {d['food']}. {d['n']} wants to make {d['k']} {d['food']}. "
                        f"How many eggs does {d['n']} need?",
              lambda d: d["e"] * d["k"] // d["c"],
              lambda d, ans: Fraction(d["e"], d["c"]) * d["k"] == ans),
    _Template("classroom", _classroom,
              lambda d: f"{d['n']}'s class has {d['g']} groups of {d['s']} students. {d['a']} students leave and {d['b']} new "
                        f"student{'s join' if d['b'] > 1 else ' joins'}. The class then splits into teams of {d['t']}. "
                        "How many teams are there?",
              lambda d: (d["g"] * d["s"] - d["a"] + d["b"]) // d["t"], _classroom_check, held_out=True),
    _Template("wages", _wages,
              lambda d: f"{d['n']} earns ${d['r']} per hour. {d['n']} works {d['h']} hours on each of the 5 weekdays and "
                        f"{d['k']} hours on Saturday, when the pay is one and a half times the usual rate. "
                        f"How many dollars does {d['n']} earn that week?",
              lambda d: 5 * d["h"] * d["r"] + d["k"] * d["r"] * 3 // 2,
              lambda d, ans: Fraction(d["r"]) * (5 * d["h"]) + Fraction(3, 2) * d["r"] * d["k"] == ans, held_out=True),
    _Template("tank", _tank,
              lambda d: f"An empty tank holds {d['c']} liters. A pipe fills it with {d['f']} liters per minute, but a leak "
                        f"loses {d['l']} liters per minute. How many minutes does it take to fill the tank?",
              lambda d: d["c"] // (d["f"] - d["l"]), _tank_check, held_out=True),
    _Template("reading", _reading,
              lambda d: f"A book has {d['p']} pages. {d['n']} reads {d['a']} pages on the first day and each day after that "
                        f"reads {d['d']} more pages than the day before. On which day does {d['n']} finish the book?",
              _reading_solve, _reading_check, held_out=True),
]


def _build_math() -> dict[str, list[dict]]:
    splits: dict[str, list[dict]] = {"eval": [], "train": []}
    for t in _TEMPLATES:
        r = random.Random(f"specdec-math-{t.name}")  # string seeds are stable across runs and platforms
        want = MATH_EVAL_PER_TEMPLATE + (0 if t.held_out else MATH_TRAIN_PER_TEMPLATE)
        seen: set[str] = set()
        made: list[dict] = []
        for _ in range(100 * want):
            if len(made) == want:
                break
            d = t.draw(r)
            q = t.text(d)
            if q in seen:
                continue
            seen.add(q)
            ans = t.solve(d)
            if not (isinstance(ans, int) and ans > 0 and t.check(d, ans)):
                raise AssertionError(f"math template {t.name}: answer {ans!r} failed its check for {d}")
            made.append({"question": q, "answer": ans, "template": t.name, "held_out": t.held_out, "numbers": d})
        if len(made) < want:
            raise AssertionError(f"math template {t.name} made only {len(made)} distinct problems, wanted {want}")
        splits["eval"] += made[:MATH_EVAL_PER_TEMPLATE]
        splits["train"] += made[MATH_EVAL_PER_TEMPLATE:]
    for name, items in splits.items():
        for i, item in enumerate(items):
            item["id"] = f"math-{name}-{i:03d}"
    return splits


_MATH_CACHE: dict[str, list[dict]] | None = None


def math_problems(split: str = "eval") -> list[dict]:
    """Generated word problems: dicts with question, answer (int), template, held_out, numbers, id.

    ``split``: "eval" (96 problems, 12 templates, the benchmark's set), "train" (240, from the 8
    templates that are not held out; disjoint from eval) or "all"."""
    global _MATH_CACHE
    if split not in ("eval", "train", "all"):
        raise ValueError(f"unknown math split {split!r}; choose 'eval', 'train' or 'all'")
    if _MATH_CACHE is None:
        _MATH_CACHE = _build_math()
    items = _MATH_CACHE["eval"] + _MATH_CACHE["train"] if split == "all" else _MATH_CACHE[split]
    return [dict(item, numbers=dict(item["numbers"])) for item in items]
