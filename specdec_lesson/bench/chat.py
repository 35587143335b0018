"""General chat prompts: the benchmark's fourth prompt style, held out from every training set.

Code completion, function requests and word problems are narrow; a user of a chat model mostly asks for
explanations, how-to steps, summaries, advice, short writing, lists, comparisons and definitions.  The prompts
here were written for this module, one by one, on subjects that no training source uses: neither the templated
topics nor the templates of ``distill.chat_prompts``, nor the target's own sampled (Magpie) questions in the
shipped mixture, which ``distill.mixture`` filters against this list and ``tests/test_mixture.py`` checks,
near-duplicates included (``distill.overlap``).  The list is fixed, so the set is the same on every machine.

    from specdec_lesson.bench.chat import chat_prompts
    chat_prompts()[0]["text"]
"""

from __future__ import annotations

__all__ = ["CHAT_PROMPTS", "chat_prompts"]

# (style, user message): written for this module; styles spread so any prefix (--limit) mixes them
CHAT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("explanation", "Explain why bread goes stale faster in the fridge than on the kitchen counter."),
    ("how-to", "How do I remove a stripped screw without damaging the wood around it?"),
    ("summary", "Summarise the main reasons the Ottoman Empire declined, in one short paragraph."),
    ("advice", "My roommate never does the dishes and I don't want to start a fight. How should I bring it up?"),
    ("writing", "Write a short, friendly message inviting my neighbours to a street picnic next Saturday."),
    ("list", "Give me five ideas for a rainy afternoon at home with two bored kids."),
    ("comparison", "What is the difference between weather and climate? Keep it brief."),
    ("definition", "What does the word 'serendipity' mean? Use it in a sentence."),
    ("rewriting", "Rewrite this so it sounds more polite: 'Send me the report today or don't bother coming in tomorrow.'"),
    ("science", "How do bats find their way around in complete darkness?"),
    ("history", "Why did the Titanic sink so quickly after it hit the iceberg?"),
    ("writing", "Write a four-line poem about a lighthouse keeper on a stormy night."),
    ("explanation", "Explain to a first-time home buyer what a mortgage is and how its interest is charged."),
    ("advice", "I have a job offer in another city, but all my friends live here. What should I weigh before deciding?"),
    ("how-to", "List the steps to brew pour-over coffee at home, from grinding the beans to serving."),
    ("history", "Tell me about the history of the bicycle in a few sentences."),
    ("summary", "Summarise the plot of Romeo and Juliet for someone who has never read it."),
    ("advice", "How can I keep my houseplants alive while I am away travelling for two weeks?"),
    ("science", "Can you explain how noise-cancelling headphones cancel out sound?"),
    ("writing", "Suggest a name and a one-sentence slogan for a small bakery that sells sourdough loaves."),
)


def chat_prompts() -> list[dict]:
    """The held-out chat prompts: dicts with ``id`` (``chat-000`` ..), ``style`` and ``text`` (the user message)."""
    return [{"id": f"chat-{i:03d}", "style": style, "text": text} for i, (style, text) in enumerate(CHAT_PROMPTS)]
