"""The draft's training mixture: the target's own answers to prompts of many styles (``python -m specdec_lesson.distill mix``).

Each shard ``mix_<seed>_<nnn>.npz`` holds ``shard_size`` answers (prompt and reply token ids, like ``distill answers``'
files, so ``drafters.suffix.load_answer_corpus`` and ``distill features --answers`` read it) to a mixture of (default
shares, ``SHARES``):

* ``chat``: templated chat requests (``distill.chat_prompts``: topics crossed with task templates; ``--chat-set 2``
  takes the second set, ``distill.chat_prompts2``, with other subjects and phrasings), 45%;
* ``magpie``: questions the target writes itself after its chat template's user-turn prefix (``distill.magpie``),
  sampled at the start of the shard, filtered, deduplicated against earlier shards (of this and lower seeds) and every
  held-out evaluation prompt, near-duplicates included (``distill.overlap``), 25% (a shortfall is filled with
  more templated chat requests);
* ``code``: HumanEval 0..81 and standard-library functions (``distill.data.training_prompts``), 18%;
* ``math``: word problems of ``distill.data``'s own templates, 12%.

The target answers greedily, and one answer in ``SAMPLE_EVERY`` (3) at T = 0.7, in batches of prompts of similar
length (left padding, ``teacher.generate_teacher``), at most ``max_new`` tokens each.  Everything is a function of
the seed and the shard index (prompt slices, the sampled rows, one ``torch.Generator`` per batch), so a rerun of the
same command makes the same shards (bit for bit on the same machine and thread count; elsewhere the float rounding
of the matrix products may differ, and with it an occasional near-tie token).  Finished shards are skipped (resume)
and never overwritten: a shard made with other settings stops the run before the model loads, naming it.  Shards
are written atomically (``answers._save``: a temporary file, fsync, rename).  Besides the answers' arrays a shard
stores ``temperature`` (float32 per answer) and in its meta the settings, the counts and the Magpie questions (their
text, for the disjointness test).  ``--fast`` runs the same code on a tiny random model with a byte-level stand-in
tokenizer.  ``--shares`` changes the proportions.  A later seed asks new questions: the templated chat prompts and
Magpie questions of lower seeds' shards under ``--out`` are left out of its pools (``after`` in its settings counts
those shards, so a resume after they changed stops).  The shards of seed 0 under ``specdec_lesson/data/mixture`` were
made on the 2-core CPU, at low priority beside other work, those of seed 1 (Magpie-heavier; 20 shards, 1.61M positions
in 2.5 hours on a 2-core Intel Xeon alone: 178 positions/s, about 7.5 minutes a shard of 80k positions) with::

    nice -n 19 python -m specdec_lesson.distill mix --seed 0 --shards 30 --shard-size 384 --batch 64 --max-new 192 --threads 2
    python -m specdec_lesson.distill mix --seed 1 --shards 20 --shard-size 384 --batch 64 --max-new 192 --threads 2 \
        --shares chat=0.30,magpie=0.40,code=0.18,math=0.12

Stage 3 (session 13, issue 24) trained the stage-2 draft further on the mixture of prompt styles (``mix``: 30 shards of
seed 0, 11,520 answers, 2.3M positions, plus both answer files: 2.7M positions; features in bf16 autocast, 82 minutes
beside other work; training 1000 steps of 4096 padded positions, three unrolled steps, 39 minutes alone on
2 threads); its output subset is export's (the 8192 most frequent reply tokens of the training answers, then prompt
and standard-library tokens); re-choosing N by acceptance per millisecond on the mixture's validation split
(``benchmarks/draft_vocab.py --mixture runs/mix1``) is the next step::

    python -m specdec_lesson.distill mix --seed 0 --shards 30 --shard-size 384 --batch 64 --max-new 192 --threads 2
    python -m specdec_lesson.distill features --out runs/mix1 --mixture --bf16 --aux-layers none --threads 2
    python -m specdec_lesson.distill heldout --out runs/held4 --n-code 12 --n-math 12 --n-requests 12 --n-chat 12 \
        --max-new 128 --threads 1
    python -m specdec_lesson.distill train --out runs/mix1 --init specdec_lesson/data --steps 1000 --budget 4096 \
        --lr 5e-4 --n-sub 4096 --unroll 3 --ckpt-every 50 --val-every 100 --bf16 --threads 2
    mkdir -p runs/stage2 && cp specdec_lesson/data/eagle_smollm2.* runs/stage2/   # the stage-2 draft, for "before"
    ln -s "$PWD/runs/held4/heldout.pt" runs/mix1/heldout.pt       # the curve's held-out scores (never used to choose)
    python -m specdec_lesson.distill export --out runs/mix1 --n-sub 8192 --curve-every 4 \
        --init-json runs/stage2/eagle_smollm2.json --force

Stages 4-6 (sessions 18-19, on an Intel Xeon with AMX) trained the shipped stage-3 draft further on the same 2.7M
positions (features in bf16 autocast, 22 minutes; each stage 1200 steps at lr 3e-4, about 32 minutes), each from the
one before; stage 6 draws its batches with ``--seed 1`` (stages 4 and 5 both used seed 0, so they saw the batches in
the same order).  ``benchmarks/results/draft_styles.json`` scores every stage on the same held-out prompts.  Stage 6,
re-headed to the 2048-token output subset that ``draft_vocab_mixture_intel.json`` found fastest, was shipped on
2026-12-06 (``benchmarks/candidates/README.md`` says how a later candidate is shipped)::

    python -m specdec_lesson.distill features --out runs/mix4 --mixture --bf16 --aux-layers none --threads 2
    ln -s "$PWD/runs/held4/heldout.pt" runs/mix4/heldout.pt
    python -m specdec_lesson.distill train --out runs/mix4 --init specdec_lesson/data --steps 1200 --budget 4096 \
        --lr 3e-4 --n-sub 4096 --unroll 3 --ckpt-every 50 --val-every 100 --bf16 --threads 2
    python -m specdec_lesson.distill export --out runs/mix4 --dest runs/stage4 --n-sub 8192 --curve-every 6 \
        --init-json specdec_lesson/data/eagle_smollm2.json
    # stage 5: a folder runs/mix5 with data -> runs/mix4/data and the heldout.pt link, --init runs/stage4,
    # exported to runs/stage5; stage 6: runs/mix6, --init runs/stage5 --seed 1, exported to runs/stage6
    python -m specdec_lesson.distill resubset --src runs/stage6 --dest benchmarks/candidates/stage6 --n-sub 2048 \
        --heldout runs/held4/heldout.pt
    cp benchmarks/candidates/stage6/eagle_smollm2* specdec_lesson/data/   # shipped with a rerun of the benchmarks

Stage 7 (session 22, AMD EPYC Zen 5), the shipped draft since the evening of 2026-12-06: stage 6 trained 1200 more steps on the
seed-1 shards alone (questions no earlier shard asked; 1.54M positions; features 16 minutes, training 25), re-headed
to N = 2048; the commands are in ``benchmarks/candidates/README.md``.
"""

from __future__ import annotations

import hashlib
import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ..drafters.suffix import ANSWERS_FORMAT, load_answer_corpus
from .answers import _save
from .chat_prompts import check_chat_set, templated_chat_prompts
from .data import MATH_TEMPLATE, chat_text, humaneval_train_prompts, math_train_questions, training_prompts
from .magpie import MAGPIE_SETTINGS, clean_question, sample_user_turns, user_turn_prefix
from .overlap import NearDuplicateIndex, content, heldout_texts
from .teacher import generate_teacher

__all__ = ["DEFAULT_DIR", "MIX_FORMAT", "SHARES", "SAMPLE_EVERY", "SAMPLED_T", "shard_path", "mixture_files",
           "shard_counts", "check_shares", "run_mix"]

MIX_FORMAT = 2  # 1: a shard's chat slice strides by chat + magpie (seed 0); 2: by chat, a Magpie shortfall filled
# from the pool's other end (so a small chat share does not skip most of the pool)
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "data" / "mixture"
SHARES = {"chat": 0.45, "magpie": 0.25, "code": 0.18, "math": 0.12}
SAMPLE_EVERY, SAMPLED_T = 3, 0.7
_POOL_OFFSET = 10_000  # code / math pools use seed + this: another code order, other math than gen / answers seeds


def shard_path(out: Path, seed: int, i: int) -> Path:
    return out / f"mix_{seed}_{i:03d}.npz"


def mixture_files(out: Path = DEFAULT_DIR) -> list[Path]:
    """Every finished mixture shard under ``out`` (all seeds), sorted."""
    return sorted(out.glob("mix_*_*.npz"))


def check_shares(shares: dict[str, float]) -> dict[str, float]:
    """``shares`` if it gives every kind of ``SHARES`` (and no other) a share >= 0, summing to 1; else ValueError."""
    if set(shares) != set(SHARES):
        raise ValueError(f"the shares name {sorted(shares)}: give each of {sorted(SHARES)} once")
    if any(not 0 <= v <= 1 for v in shares.values()) or abs(sum(shares.values()) - 1) > 1e-6:
        raise ValueError(f"the shares {shares} must each lie in [0, 1] and sum to 1 (they sum to "
                         f"{sum(shares.values()):g})")
    return {k: float(shares[k]) for k in SHARES}


def shard_counts(shard_size: int, shares: dict[str, float] | None = None) -> dict[str, int]:
    """Answers of each kind in a shard of ``shard_size``: ``shares`` (default ``SHARES``) rounded by largest
    remainder."""
    raw = {k: shard_size * s for k, s in (shares or SHARES).items()}
    counts = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: counts[k] - raw[k])[: shard_size - sum(counts.values())]:
        counts[k] += 1
    return counts


def _seed_of(*parts) -> int:
    """A 63-bit seed from the parts (stable across runs and machines, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


class _ByteTokenizer:
    """``--fast``'s stand-in tokenizer for the tiny random target (vocabulary 96): bytes folded onto ids 3..95,
    prompts cut to their last 48 tokens, id 2 the end of turn."""

    vocab_size, eos_token_id, pad_token_id, chat_template = 96, 2, 2, "tiny"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False) -> str:
        return "".join(f"<{m['role']}>{m['content']}</>" for m in messages) + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [3 + b % 93 for b in text.encode()][-48:]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(32 + (int(i) - 3) % 93) for i in ids if int(i) >= 3)


@lru_cache(maxsize=8)
def _templated(seed: int, chat_set: int = 1) -> tuple[str, ...]:
    return tuple(t for _, t in templated_chat_prompts(seed, chat_set))


def _chat_pool(seed: int, earlier: list[dict], after: dict[str, int] | None = None, chat_set: int = 1) -> list[str]:
    """The seed's templated chat prompts (of ``chat_set``), less those that ``earlier`` shards of lower seeds answered
    (with ``after``, only seed s's first ``after[s]`` shards: the ones there when a shard of ``seed`` was made)."""
    keep = [m for m in earlier if m["seed"] < seed and (after is None or m["shard"] < after.get(str(m["seed"]), 0))]
    used: set[str] = set()
    for m in keep:  # each earlier shard's own pool, recomputed the same way
        counts = shard_counts(m["shard_size"], m.get("shares"))
        pool = _chat_pool(m["seed"], keep, m.get("after", {}), m.get("chat_set", 1))
        used.update(_chat_slice(pool, m["shard"], counts, len(m["magpie_questions"]), m["mixture"]))
    mine = _templated(seed, chat_set)
    return [t for t in mine if t not in used] or list(mine)  # all used: start again


def _earlier_seeds(out: Path, seed: int) -> tuple[dict[str, int], list[dict]]:
    """The shards of lower seeds under ``out``: their count per seed (recorded in the settings, so that a resume
    after they changed stops) and their metas."""
    metas = [load_answer_corpus(p)[1] for p in mixture_files(out)]
    metas = [m for m in metas if m["seed"] < seed]
    after: dict[str, int] = {}
    for m in metas:
        after[str(m["seed"])] = after.get(str(m["seed"]), 0) + 1
    return dict(sorted(after.items())), metas


def _pools(seed: int, fast: bool, earlier: list[dict] = (), chat_set: int = 1) -> dict[str, list[str]]:
    """The seed's ordered prompt lists: templated chat (less the ones ``earlier`` shards of lower seeds answered, so
    that a new seed asks new questions while any are left), code (wrapped); math questions come per shard."""
    if fast:  # HumanEval only: parsing the standard library takes seconds
        from .data import CODE_TEMPLATE

        code = [CODE_TEMPLATE.format(prompt=p) for p in humaneval_train_prompts()]
    else:
        code = [t for _, t in training_prompts(100_000, 0, seed + _POOL_OFFSET)]
    return {"chat": _chat_pool(seed, list(earlier), chat_set=chat_set), "code": code}


def _take(pool: list[str], start: int, n: int) -> list[str]:
    return [pool[(start + j) % len(pool)] for j in range(n)]


def _magpie(model, tok, n: int, batch: int, gen: torch.Generator, seen: NearDuplicateIndex,
            heldout: NearDuplicateIndex) -> tuple[list[str], int]:
    """Up to ``n`` new clean questions (at most 4 candidates per wanted one); returns them and the candidates drawn."""
    prefix = tok(user_turn_prefix(tok), add_special_tokens=False)["input_ids"]
    got: list[str] = []
    drawn = 0
    while len(got) < n and drawn < 4 * n:
        for ids, ended in sample_user_turns(model, prefix, batch, MAGPIE_SETTINGS["max_new"], gen, tok.eos_token_id,
                                            MAGPIE_SETTINGS["temperature"], MAGPIE_SETTINGS["top_p"]):
            q = clean_question(tok.decode(ids, skip_special_tokens=False), ended)
            if q is not None and len(got) < n and seen.match(q) is None and heldout.match(q) is None:
                seen.add(q)
                got.append(q)
        drawn += batch
    return got, drawn


def _chat_slice(pool: list[str], i: int, counts: dict[str, int], n_questions: int, layout: int) -> list[str]:
    """Shard ``i``'s templated chat prompts: ``counts["chat"]``, and as many more as Magpie fell short of
    ``counts["magpie"]`` (``layout``: ``MIX_FORMAT`` of the shard)."""
    short = counts["magpie"] - n_questions
    if layout == 1:  # the slice strides by chat + magpie, sized for a shortfall
        n_chat = counts["chat"] + counts["magpie"]
        return _take(pool, i * n_chat, n_chat)[: counts["chat"] + short]
    return _take(pool, i * counts["chat"], counts["chat"]) + _take(pool[::-1], i * counts["magpie"], short)


def _shard_items(seed: int, i: int, pools: dict, counts: dict[str, int], questions: list[str]) -> list[tuple[str, str]]:
    """Shard ``i``'s (kind, user text): its slices of the seed's pools, and the Magpie ``questions``."""
    chat = _chat_slice(pools["chat"], i, counts, len(questions), MIX_FORMAT)
    items = [("chat", t) for t in chat] + [("magpie", q) for q in questions]
    items += [("code", t) for t in _take(pools["code"], i * counts["code"], counts["code"])]
    math = math_train_questions((i + 1) * counts["math"], seed + _POOL_OFFSET)[i * counts["math"]:]
    return items + [("math", MATH_TEMPLATE.format(question=q)) for q in math]


def _answer(model, tok, items: list[tuple[str, str]], seed: int, i: int, batch: int, max_new: int, bar) -> list[dict]:
    """The target's answers to ``items``: one in ``SAMPLE_EVERY`` (a seeded choice) at ``SAMPLED_T``, the others greedy;
    each temperature's prompts in batches of similar length, one generator per batch."""
    order = list(range(len(items)))
    np.random.default_rng(_seed_of("order", seed, i)).shuffle(order)
    temps = {j: SAMPLED_T if r % SAMPLE_EVERY == SAMPLE_EVERY - 1 else 0.0 for r, j in enumerate(order)}
    ids = [tok(chat_text(tok, t), add_special_tokens=False)["input_ids"] for _, t in items]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows: list[dict] = []
    for temp in (0.0, SAMPLED_T):
        group = sorted((j for j in range(len(items)) if temps[j] == temp), key=lambda j: (len(ids[j]), j))
        for b in range(0, len(group), batch):
            chunk = group[b:b + batch]
            g = torch.Generator().manual_seed(_seed_of("answers", seed, i, temp, b))
            with torch.inference_mode():
                made = generate_teacher(model, [ids[j] for j in chunk], max_new, temp, g, tok.eos_token_id, pad)
            rows += [{"tokens": r["tokens"].tolist(), "n_prompt": r["n_prompt"], "kind": items[j][0], "temperature": temp}
                     for r, j in zip(made, chunk)]
            bar.update(len(chunk))
    return rows


def _settings(seed, shard_size, batch, max_new, name, shares, after, chat_set=1) -> dict:
    settings = {"format": ANSWERS_FORMAT, "mixture": MIX_FORMAT, "seed": seed, "shard_size": shard_size,
                "batch": batch, "max_new": max_new, "shares": shares, "sample_every": SAMPLE_EVERY,
                "sampled_temperature": SAMPLED_T, "magpie": MAGPIE_SETTINGS, "model": name}
    settings = dict(settings, after=after) if after else settings  # seed 0's shards predate "after"
    return dict(settings, chat_set=chat_set) if chat_set != 1 else settings  # seeds 0-2 predate the second set


def _check_existing(out: Path, seed: int, shards: int, settings: dict) -> list[dict]:
    """The metas of the seed's finished shards among the first ``shards``; ValueError naming one made otherwise."""
    metas = []
    for i in range(shards):
        path = shard_path(out, seed, i)
        if not path.exists():
            continue
        meta = load_answer_corpus(path)[1]
        had, now = dict(meta, chat_set=meta.get("chat_set", 1)), dict(settings, chat_set=settings.get("chat_set", 1))
        diff = sorted(k for k in now if had.get(k) != now[k])
        if diff:
            got = ", ".join(f"{k}={had.get(k)!r} (now {now[k]!r})" for k in diff)
            raise ValueError(f"shard {path} was made with other settings ({got}); it is never overwritten: rerun with "
                             f"those settings to resume, or use another --out or --seed")
        metas.append(meta)
    return metas


def run_mix(out: Path, seed: int, shards: int, shard_size: int = 256, batch: int = 32, max_new: int = 192,
            fast: bool = False, progress: bool = True, model=None, tokenizer=None,
            shares: dict[str, float] | None = None, chat_set: int = 1) -> dict:
    """Write shards 0..``shards``-1 of ``seed`` under ``out`` that are missing; returns a summary (shards written and
    skipped, positions, positions per second).  ``shares`` (default ``SHARES``) sets the kinds' proportions.  The
    shards of lower seeds already under ``out`` shape this seed's: their templated chat prompts and Magpie
    questions are not asked again (their count per seed is in the settings as ``after``).  ``chat_set`` picks the
    templated prompts' set (``chat_prompts.CHAT_SETS``; recorded in the settings from the second on)."""
    from tqdm import tqdm

    shares = check_shares(shares or SHARES)
    check_chat_set(chat_set)  # before the model loads
    name = "tiny random (--fast)" if fast else "a model passed in"
    if model is None and not fast:
        from ..models import DEFAULT_TARGET_NAME

        name = DEFAULT_TARGET_NAME  # a name, never a path of this machine
    after, earlier = _earlier_seeds(out, seed)
    settings = _settings(seed, shard_size, batch, max_new, name, shares, after, chat_set)
    metas = _check_existing(out, seed, shards, settings)  # before the model loads
    todo = [i for i in range(shards) if not shard_path(out, seed, i).exists()]
    summary = {"shards_written": 0, "shards_skipped": shards - len(todo), "positions": 0, "reply_tokens": 0, "seconds": 0.0}
    if not todo:
        return summary
    if model is None:
        if fast:
            from ..models import tiny_llama

            model = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=seed % 2**32, dtype=torch.float32)
            tokenizer = _ByteTokenizer()
        else:
            from ..models import load_default_target

            model, tokenizer = load_default_target(verbose=False, fast=True)  # pre-packed: batched rows run faster
    if tokenizer.vocab_size > 65536:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens; shards store ids as uint16 (< 65536)")
    pools = _pools(seed, fast, earlier, chat_set)
    heldout = NearDuplicateIndex([content(t) for _, t in heldout_texts()])
    counts = shard_counts(shard_size, shares)
    before = [q for m in earlier for q in m["magpie_questions"]]
    t_start = time.time()
    bar = tqdm(total=len(todo) * shard_size, desc=f"mix seed {seed}", unit="ans", disable=not progress)
    for i in todo:
        t0 = time.time()
        seen = NearDuplicateIndex(before + [q for m in metas if m["shard"] < i for q in m["magpie_questions"]])
        gen = torch.Generator().manual_seed(_seed_of("magpie", seed, i))
        with torch.inference_mode():
            questions, drawn = _magpie(model, tokenizer, counts["magpie"], batch, gen, seen, heldout)
        items = _shard_items(seed, i, pools, counts, questions)
        rows = _answer(model, tokenizer, items, seed, i, batch, max_new, bar)
        positions = sum(len(r["tokens"]) for r in rows)
        reply = sum(len(r["tokens"]) - r["n_prompt"] for r in rows)
        seconds = time.time() - t0
        meta = dict(settings, shard=i, answers=len(rows), tokens=positions, reply_tokens=reply,
                    kinds={k: sum(r["kind"] == k for r in rows) for k in SHARES}, magpie_questions=questions,
                    chat_prompts_left=len(pools["chat"]),
                    magpie_drawn=drawn, seconds=round(seconds, 1))
        if shard_path(out, seed, i).exists():  # never replaced, even when another run wrote it meanwhile
            raise ValueError(f"shard {shard_path(out, seed, i)} appeared while this run was making it: another run with "
                             f"--seed {seed} writes to {out}; run one at a time, then rerun this command to resume")
        _save(shard_path(out, seed, i), rows, meta, {"temperature": np.asarray([r["temperature"] for r in rows], np.float32)})
        metas.append(meta)
        summary["shards_written"] += 1
        summary["positions"] += positions
        summary["reply_tokens"] += reply
        bar.set_postfix(pos_per_s=f"{summary['positions'] / (time.time() - t_start):.0f}")
        bar.write(json.dumps({"shard": shard_path(out, seed, i).name, "answers": len(rows), "positions": positions,
                              "reply_tokens": reply, "magpie": f"{len(questions)}/{drawn}", "seconds": round(seconds, 1),
                              "positions_per_s": round(positions / seconds, 1)}))
    bar.close()
    summary["seconds"] = round(time.time() - t_start, 1)
    summary["positions_per_s"] = round(summary["positions"] / max(summary["seconds"], 1e-9), 1)
    return summary
