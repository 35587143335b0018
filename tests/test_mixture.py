"""The draft's training mixture (distill.mixture, chat_prompts, magpie, overlap) and the held-out chat task."""

import random

import numpy as np
import pytest
import torch

from specdec_lesson.distill import mixture
from specdec_lesson.distill.chat_prompts import CHAT_SETS, all_topics, templated_chat_prompts
from specdec_lesson.distill.magpie import clean_question, sample_user_turns, user_turn_prefix
from specdec_lesson.distill.overlap import NearDuplicateIndex, content, heldout_texts, normalise
from specdec_lesson.drafters.suffix import KINDS, load_answer_corpus
from specdec_lesson.models import tiny_llama

FAST = dict(shard_size=12, batch=4, max_new=6, fast=True, progress=False)


def _shard(path):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = load_answer_corpus(path)[1]
    meta.pop("seconds")
    arrays["meta"] = meta
    return arrays


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]) if k == "meta" else np.array_equal(a[k], b[k]), k


def test_shard_counts_and_templated_prompts_are_fixed():
    for size in (12, 256, 384):
        counts = mixture.shard_counts(size)
        assert sum(counts.values()) == size and set(counts) == {"chat", "magpie", "code", "math"}
    assert mixture.shard_counts(384) == {"chat": 173, "magpie": 96, "code": 69, "math": 46}
    a, b = templated_chat_prompts(0), templated_chat_prompts(1)
    assert a == templated_chat_prompts(0) and a != b and sorted(a) == sorted(b)
    assert len({t for _, t in a}) == len(a) > 5000
    assert {c for c, _ in a} >= {"explanation", "how-to", "science", "history", "writing", "rewriting", "list", "summary",
                                 "advice", "comparison", "definition"}


def test_mix_is_deterministic_resumes_after_an_interruption_and_never_overwrites(tmp_path, monkeypatch):
    whole = mixture.run_mix(tmp_path / "a", 5, 3, **FAST)
    assert whole["shards_written"] == 3 and whole["positions"] > 0
    first = [_shard(mixture.shard_path(tmp_path / "a", 5, i)) for i in range(3)]
    rows, meta = load_answer_corpus(mixture.shard_path(tmp_path / "a", 5, 0))
    assert len(rows) == 12 and {r["kind"] for r in rows} <= set(KINDS) and meta["seed"] == 5
    assert np.array_equal(np.sort(first[0]["temperature"]), np.float32([0.0] * 8 + [0.7] * 4))  # one answer in 3 sampled
    # an interrupted run (Ctrl-C in the second shard), then the same command again: the same shards
    real, calls = mixture.generate_teacher, []

    def stop_in_shard_two(*args, **kw):
        calls.append(1)
        if len(calls) == 5:  # shard 0 has 3 batches (8 greedy + 4 sampled, batch 4); this is shard 1's second
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(mixture, "generate_teacher", stop_in_shard_two)
    with pytest.raises(KeyboardInterrupt):
        mixture.run_mix(tmp_path / "b", 5, 3, **FAST)
    assert [p.name for p in sorted((tmp_path / "b").iterdir())] == ["mix_5_000.npz"]  # no partial shard, no temp file
    monkeypatch.setattr(mixture, "generate_teacher", real)
    again = mixture.run_mix(tmp_path / "b", 5, 3, **FAST)
    assert (again["shards_written"], again["shards_skipped"]) == (2, 1)
    for i in range(3):
        _same(first[i], _shard(mixture.shard_path(tmp_path / "b", 5, i)))
    assert mixture.run_mix(tmp_path / "b", 5, 3, **FAST)["shards_written"] == 0  # all finished: nothing to do
    other = mixture.run_mix(tmp_path / "c", 6, 1, **FAST)
    assert other["shards_written"] == 1
    assert not np.array_equal(_shard(mixture.shard_path(tmp_path / "c", 6, 0))["tokens"], first[0]["tokens"])
    # other settings: refused before any work, the finished shard untouched
    path = mixture.shard_path(tmp_path / "b", 5, 0)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"mix_5_000\.npz was made with other settings \(max_new=6 \(now 7\)\).*never "
                                         r"overwritten"):
        mixture.run_mix(tmp_path / "b", 5, 4, **dict(FAST, max_new=7))
    assert path.read_bytes() == before and not mixture.shard_path(tmp_path / "b", 5, 3).exists()


def test_a_later_seed_asks_new_questions_with_its_own_shares_and_stops_if_the_earlier_seed_changed(tmp_path, monkeypatch):
    asked: dict[int, list[tuple[str, str]]] = {}
    real = mixture._answer

    def record(model, tok, items, seed, i, *args):
        asked.setdefault(seed, []).extend(items)
        return real(model, tok, items, seed, i, *args)

    monkeypatch.setattr(mixture, "_answer", record)
    small = [("chat", f"Tell me about item {j}.") for j in range(60)]  # a small pool: seed 0 uses a good part of it
    monkeypatch.setattr(mixture, "templated_chat_prompts", lambda seed, chat_set=1: random.Random(seed).sample(small, len(small)))
    mixture._templated.cache_clear()
    monkeypatch.setattr(mixture, "_templated", mixture._templated.__wrapped__)
    mixture.run_mix(tmp_path, 0, 3, **FAST)
    shares = {"chat": 0.5, "magpie": 0.25, "code": 0.25, "math": 0.0}
    mixture.run_mix(tmp_path, 1, 3, **FAST, shares=shares)
    chat = {s: [t for k, t in asked[s] if k == "chat"] for s in (0, 1)}
    magpie = {s: [t for k, t in asked[s] if k == "magpie"] for s in (0, 1)}
    assert len(chat[1]) >= 3 * 6 and len(set(chat[1])) == len(chat[1])  # 6 chat prompts a shard, none repeated
    assert not set(chat[0]) & set(chat[1]) and not set(magpie[0]) & set(magpie[1])  # seed 1 asks new questions
    assert mixture._chat_pool(1, mixture._earlier_seeds(tmp_path, 1)[1])[:6] == chat[1][:6]  # recomputed alike
    for i in range(3):
        rows, meta = load_answer_corpus(mixture.shard_path(tmp_path, 1, i))
        assert meta["after"] == {"0": 3} and meta["shares"] == shares and meta["mixture"] == mixture.MIX_FORMAT
        assert not any(r["kind"] == "math" for r in rows) and sum(r["kind"] == "code" for r in rows) == 3
    mixture.run_mix(tmp_path, 0, 4, **FAST)  # seed 0 grows: seed 1's pool would change, so its resume stops
    with pytest.raises(ValueError, match=r"mix_1_000\.npz was made with other settings \(after=\{'0': 3\} \(now "
                                         r"\{'0': 4\}\)\)"):
        mixture.run_mix(tmp_path, 1, 4, **FAST, shares=shares)
    with pytest.raises(ValueError, match=r"must each lie in \[0, 1\] and sum to 1"):
        mixture.run_mix(tmp_path, 2, 1, **FAST, shares=dict(shares, math=0.5))


def test_the_second_chat_set_is_new_and_a_seed_that_uses_it_records_it(tmp_path, monkeypatch):
    """Set 2 (distill.chat_prompts2) shares no prompt and no subject with set 1; a seed made with it asks only its
    prompts, records ``chat_set`` (set 1's shards, like the committed seeds 0-2, carry none), and a resume with the
    other set stops before any work, naming it."""
    one, two = templated_chat_prompts(0), templated_chat_prompts(0, 2)
    assert two == templated_chat_prompts(0, 2) != templated_chat_prompts(1, 2)
    assert len({t for _, t in two}) == len(two) > 4000
    assert not {t for _, t in one} & {t for _, t in two}
    topics = [{t if isinstance(t, str) else t[0] for _, ts, _ in CHAT_SETS[s].values() for t in ts} for s in (1, 2)]
    assert not topics[0] & topics[1]
    asked: list[tuple[str, str]] = []
    real = mixture._answer
    monkeypatch.setattr(mixture, "_answer", lambda model, tok, items, *a: asked.extend(items) or real(model, tok, items, *a))
    with pytest.raises(ValueError, match="chat set 3 does not exist: choose one of"):
        mixture.run_mix(tmp_path, 0, 1, **FAST, chat_set=3)
    mixture.run_mix(tmp_path, 0, 1, **FAST)
    assert all(t in {t for _, t in one} for k, t in asked if k == "chat")
    asked.clear()
    mixture.run_mix(tmp_path, 1, 2, **FAST, chat_set=2)
    assert "chat_set" not in load_answer_corpus(mixture.shard_path(tmp_path, 0, 0))[1]
    chat = [t for k, t in asked if k == "chat"]
    assert len(chat) >= 2 * 5 and set(chat) <= {t for _, t in two}
    for i in range(2):
        meta = load_answer_corpus(mixture.shard_path(tmp_path, 1, i))[1]
        assert meta["chat_set"] == 2 and meta["chat_prompts_left"] == len(two)
    assert mixture._chat_pool(1, mixture._earlier_seeds(tmp_path, 1)[1], chat_set=2)[:3] == chat[:3]
    with pytest.raises(ValueError, match=r"mix_1_000\.npz was made with other settings \(chat_set=2 \(now 1\)\)"):
        mixture.run_mix(tmp_path, 1, 3, **FAST)


def test_mix_command_line(tmp_path, capsys):
    from specdec_lesson.distill.cli import main

    args = ["mix", "--fast", "--seed", "2", "--shards", "1", "--shard-size", "6", "--batch", "3", "--max-new", "4",
            "--out", str(tmp_path)]
    assert main(args) == 0 and mixture.mixture_files(tmp_path) == [tmp_path / "mix_2_000.npz"]
    assert main(args[:-2] + ["--max-new", "5", "--out", str(tmp_path)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert main(["mix", "--fast", "--shards", "0", "--out", str(tmp_path)]) == 2
    assert "--shards must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(args[:-2] + ["--shares", "chat=0.5,magpie=0.5", "--out", str(tmp_path)]) == 2
    assert "the shares name ['chat', 'magpie']: give each of ['chat', 'code', 'magpie', 'math'] once" in capsys.readouterr().err


def test_magpie_prefix_sampling_and_filter():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
            return "<sys>default</sys>" + "".join(f"<{m['role']}>{m['content']}</>" for m in msgs)

    assert user_turn_prefix(Tok()) == "<sys>default</sys><user>"
    Tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        user_turn_prefix(Tok())
    model = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=1, dtype=torch.float32)
    draw = lambda: sample_user_turns(model, [5, 6, 7], 6, 12, torch.Generator().manual_seed(3), eos_token_id=2)
    rows = draw()
    assert rows == draw() and len(rows) == 6
    assert all(len(ids) <= 12 and 2 not in ids and (ended or len(ids) == 12) for ids, ended in rows)
    good = "Can you suggest three ways to keep a small balcony garden tidy?"
    assert clean_question(f"  {good}\n", True) == good
    for text, ended in [(good, False), ("Hi there", True), ("word " * 90, True), ("<|im_start|>user " + good, True),
                        ("!!! ??? 123 456 789 000 ### $$$", True), ("please please please please help me", True),
                        ("a b c a b c a b c a b c a b", True)]:
        assert clean_question(text, ended) is None, text


def test_magpie_questions_are_deduplicated_and_kept_off_the_held_out_prompts(monkeypatch):
    held = [t for i, t in heldout_texts() if i.startswith("chat")]
    canned = [held[0], "What are some good ways to learn the names of the birds that visit my garden in winter?",
              held[3].replace("roommate", "flatmate"),
              "What are some good ways to learn the names of the birds that visit my garden in the winter?",
              "Tell me a fun fact about octopuses."]

    class Tok:
        eos_token_id = 2

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [3, 4]}

        def decode(self, ids, skip_special_tokens=False):
            return canned[ids[0]]

    monkeypatch.setattr(mixture, "user_turn_prefix", lambda tok: "prefix")
    monkeypatch.setattr(mixture, "sample_user_turns", lambda model, prefix, n, *a: [([j], True) for j in range(len(canned))])
    seen = NearDuplicateIndex(["Tell me a fun fact about octopuses."])  # an earlier shard's question
    got, drawn = mixture._magpie(None, Tok(), 4, 5, None, seen, NearDuplicateIndex(held))
    assert got == [canned[1]] and drawn == 20  # the held-out one, its edit, a near-repeat and an old one dropped


def test_near_duplicates_are_found():
    idx = NearDuplicateIndex(["Explain why bread goes stale faster in the fridge than on the kitchen counter.",
                              "def add(a, b):\n    \"\"\"Return the sum of a and b, two integers.\"\"\"\n"])
    assert idx.match("explain why BREAD goes stale faster in the fridge than on the kitchen counter!!") == 0
    assert idx.match("Explain why bread goes stale faster in a fridge than on the kitchen counter.") == 0  # one word
    assert idx.match("Please help. Explain why bread goes stale faster in the fridge than on the kitchen counter, "
                     "and what I can do about it with a bread box, a freezer or a cloth bag.") == 0  # copied inside
    assert idx.match("Explain why milk goes sour faster on the counter than in the fridge.") is None
    assert idx.match("Explain photosynthesis.") is None and len(idx) == 2
    from specdec_lesson.distill.data import CODE_TEMPLATE

    assert content(CODE_TEMPLATE.format(prompt="def f():\n")) == "def f():\n" and content("plain") == "plain"


def test_chat_task_is_registered_and_every_style_has_twelve_held_out_prompts():
    from specdec_lesson.bench import tasks as T

    assert "chat" in T.TASKS
    items = T.task_items("chat")
    assert len(items) >= 16 and len({i["id"] for i in items}) == len(items) == len({i["text"] for i in items})
    assert T.task_items("chat", 3) == items[:3] and items[0]["task"] == "chat"
    styles = {}
    for i, _ in heldout_texts():
        styles[i.split("/")[0].split("-")[0]] = styles.get(i.split("/")[0].split("-")[0], 0) + 1
    assert styles == {"HumanEval": 82, "request": 48, "math": 96, "chat": 20}, styles


def test_every_training_prompt_is_disjoint_from_every_held_out_prompt():
    """All four held-out styles (HumanEval 82..163, function requests, math eval, chat) against every training source,
    near-duplicates included: the shipped draft's gen prompts (seeds 0, 1), the teacher-forced corpus and every
    standard-library prompt, the shipped answer files' prompts, the mixture's templated chat prompts and code / math
    pools, and the Magpie questions of every committed mixture shard."""
    from specdec_lesson.distill.data import code_corpus, humaneval_train_prompts, math_train_questions, stdlib_function_prompts
    from specdec_lesson.drafters.suffix import ANSWER_FILES

    # distill.data.training_prompts(n_code, n_math, seed) is HumanEval 0..81, standard-library prompts (a seeded
    # choice among all of them) and math_train_questions(n_math, seed), wrapped: all of them are here, unwrapped
    train = humaneval_train_prompts() + stdlib_function_prompts(100_000, 0)
    train += math_train_questions(500, 0) + math_train_questions(600, 1)  # the shipped draft's gen runs
    for path in ANSWER_FILES:  # the shipped answer files: training prompts of a recorded seed
        if path.exists():
            meta = load_answer_corpus(path)[1]
            train += math_train_questions(meta["n_math"], meta["seed"])
    train += [u + "\n" + a for u, a in code_corpus(100_000, 0)]  # the teacher-forced corpus (functions and methods)
    train += [t for s in CHAT_SETS for _, t in templated_chat_prompts(0, s)]  # every seed's (in another order)
    n_math: dict[int, int] = {}  # per seed of the committed shards: the math questions its shards used
    for path in mixture.mixture_files():
        meta = load_answer_corpus(path)[1]
        train += meta["magpie_questions"]
        n = mixture.shard_counts(meta["shard_size"], meta["shares"])["math"] * (meta["shard"] + 1)
        n_math[meta["seed"]] = max(n, n_math.get(meta["seed"], 0))
    for seed, n in n_math.items():
        train += math_train_questions(n, seed + mixture._POOL_OFFSET)
    held = heldout_texts()
    index = NearDuplicateIndex([t for _, t in held])
    hits = [(held[j][0], t[:80]) for t in train if (j := index.match(t)) is not None]
    assert not hits, hits[:5]
    assert len(train) > 13_000
    chat = [normalise(t) for i, t in held if i.startswith("chat")]
    assert not [t for t in all_topics() if any(f" {normalise(t)} " in f" {c} " for c in chat)]  # no training topic


def test_a_shard_written_meanwhile_by_another_run_is_not_replaced(tmp_path, monkeypatch):
    real = mixture.generate_teacher
    path = mixture.shard_path(tmp_path, 4, 0)

    def other_run_finishes_first(*args, **kw):
        path.write_bytes(b"the other run's shard")
        return real(*args, **kw)

    monkeypatch.setattr(mixture, "generate_teacher", other_run_finishes_first)
    with pytest.raises(ValueError, match=r"mix_4_000\.npz appeared while this run was making it: another run"):
        mixture.run_mix(tmp_path, 4, 1, **FAST)
    assert path.read_bytes() == b"the other run's shard"
