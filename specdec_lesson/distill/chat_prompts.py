"""Templated chat prompts for the draft's training mixture: topic lists crossed with task templates.

The shipped draft learned from code and math only, and accepts about 0.13 of its tokens on plain chat.  This
module writes general chat requests (explanations, how-to, science, history, writing, rewriting, lists,
summaries, advice, comparisons, definitions) by crossing, per category, a few phrasings with a list of topics,
and some phrasings with a closing request (audience, length, format).  ``templated_chat_prompts(seed)`` is every
combination once, in an order fixed by the seed (6923 distinct prompts).  ``templated_chat_prompts(seed, 2)`` is
the second set (``distill.chat_prompts2``: other subjects, other phrasings), made when the mixture's first two
seeds had used the first up.

The benchmark's held-out chat prompts (``bench.chat``) are on other subjects: no topic here appears in one, and no
prompt here nearly repeats one (``tests/test_mixture.py``, with ``distill.overlap``).
"""

from __future__ import annotations

import random

from .chat_prompts2 import CATEGORIES_2

__all__ = ["CATEGORIES", "CHAT_SETS", "CLOSERS", "LIGHT_CLOSERS", "check_chat_set", "templated_chat_prompts", "all_topics"]

_SCIENCE = ("photosynthesis", "plate tectonics", "the water cycle", "black holes", "vaccines and the immune system",
            "static electricity", "the greenhouse effect", "DNA replication", "ocean tides", "rainbows",
            "the phases of the moon", "magnetism", "evaporation", "the speed of sound", "earthquakes",
            "the life cycle of a star", "volcanic eruptions", "the nitrogen cycle", "muscle growth", "antibiotics",
            "the northern lights", "the human heart", "gravity on other planets", "cloud formation",
            "the colours of autumn leaves", "solar panels", "the structure of an atom", "fish gills",
            "the human digestive system", "lightning")
_HISTORY = ("the printing press", "the fall of the Western Roman Empire", "the Industrial Revolution", "the Silk Road",
            "the Renaissance", "the first moon landing", "the building of the Great Wall of China", "the French Revolution",
            "the invention of writing", "the Black Death", "the Viking age", "the building of the pyramids of Giza",
            "the Meiji Restoration", "the end of the Cold War", "the invention of the telephone", "the age of sail",
            "the first Olympic Games", "the Maya civilisation", "the abolition of slavery in Britain",
            "the invention of paper", "the rise of the Mongol Empire", "the Gold Rush in California",
            "the building of the Panama Canal", "the first powered flight", "the birth of the internet")
_HOWTO = ("start a small vegetable garden", "change a flat tyre on a car", "prepare for a job interview",
          "learn a new language as an adult", "write a cover letter", "organise a cluttered wardrobe",
          "make a monthly budget", "train a puppy to sit", "back up the photos on my phone", "cook rice on the stove",
          "plan a weekend hiking trip", "improve my handwriting", "set up a home workout routine",
          "clean a cast-iron pan", "memorise a short speech", "paint a room", "start running as a beginner",
          "make a good first impression", "take better notes in class", "fix a leaking tap", "sew on a button",
          "plant a tree", "study for an exam in one week", "reduce food waste at home", "write a clear email")
_ADVICE = ("I keep procrastinating on my assignments", "I get nervous before speaking in public",
           "I want to save money but I always overspend", "I have trouble falling asleep at night",
           "I feel lonely after moving to a new school", "I never have time to read books anymore",
           "my team at work does not communicate well", "I want to eat healthier but I love snacks",
           "I am starting my first job next month", "I argue with my sibling all the time",
           "I want to get back into exercising after a long break", "I forget people's names right after meeting them",
           "I spend too much time on my phone", "I am choosing between two university courses",
           "I want to ask my manager for a raise", "I find it hard to say no to extra work",
           "I am learning to play the guitar and feel stuck", "my small business is not getting customers",
           "I get distracted when working from home", "I want to make new friends as an adult")
_WRITING = ("a short poem about autumn leaves", "a thank-you note to a teacher", "a product description for a reusable water "
            "bottle", "the opening paragraph of a mystery story", "a birthday message for a grandmother",
            "a short speech for a friend's wedding", "a haiku about the ocean", "a limerick about a clumsy cat",
            "an apology email for missing a meeting", "a short story about a robot learning to paint",
            "a motivational message for a sports team", "a review of a fictional restaurant", "a short fable with a moral",
            "a letter to a future self", "a tweet announcing a new library opening", "a recipe introduction for tomato soup",
            "a dialogue between a cat and a dog", "a postcard from a trip to the mountains",
            "a cover letter for a summer job at a bookshop", "a short biography of a fictional inventor")
_REWRITE = ("The meeting have been moved to thursday because alot of people was busy.",
            "We regret to inform you that your application was not successful at this time.",
            "The experiment results was very good and we think they shows the method work.",
            "Hey, can u send me the files asap, thx.",
            "In my opinion I think that the movie was very very good and I liked it a lot.",
            "The company will implement a new policy regarding remote work starting next quarter.",
            "Due to the fact that it was raining, the game was cancelled by the organisers.",
            "Our product is the best product on the market and everyone should buy it now.",
            "The city council approved the budget after a long debate on Tuesday night.",
            "I would like to kindly request that you consider giving me an extension on the deadline.",
            "Customers are reminded that the store closes at nine o'clock every evening.",
            "The students was told to hand in there homework before the end of the week.",
            "Our new app lets you track your daily steps, water intake and sleep in one place.",
            "It is important to note that the results may vary depending on the conditions.",
            "The train was late again and I missed the start of the concert.")
_LISTS = ("healthy breakfast ideas", "ways to save energy at home", "famous bridges around the world",
          "tips for public speaking", "board games for a family evening", "ways to reduce stress", "classic novels",
          "things to pack for a camping trip", "ways to practise a foreign language", "uses for baking soda",
          "skills every programmer should learn", "questions to ask at the end of an interview", "easy dinner recipes",
          "hobbies that cost little money", "ways to be more productive in the morning", "facts about the ocean",
          "reasons to learn history", "indoor activities for a winter weekend", "tips for taking better photos",
          "ways to make a small room feel bigger")
_SUMMARY = ("the main causes of the First World War", "the theory of evolution", "how democracy works in ancient Athens",
            "the plot of Hamlet", "the water crisis in dry regions", "the benefits of regular exercise",
            "the causes of inflation", "the life of Marie Curie", "the story of the Trojan War",
            "the ideas of the Enlightenment", "how the stock market works", "the history of the Olympic Games",
            "the plot of Pride and Prejudice", "the effects of deforestation", "the life of Leonardo da Vinci",
            "the main ideas of stoicism", "the causes of the Great Depression", "the story of Odysseus's journey home")
_COMPARE = (("cats", "dogs as pets"), ("renting a flat", "buying a house"), ("Python", "JavaScript"),
            ("trains", "planes for long trips"), ("solar power", "wind power"), ("reading books", "listening to audiobooks"),
            ("tea", "orange juice in the morning"), ("studying alone", "studying in a group"),
            ("an electric car", "a petrol car"),
            ("city life", "country life"), ("email", "phone calls at work"), ("running", "swimming for fitness"),
            ("paper notes", "digital notes"), ("a laptop", "a tablet for students"), ("saving", "investing"),
            ("summer", "winter holidays"))
_DEFINE = ("inflation", "a metaphor", "an algorithm", "biodiversity", "a haiku", "compound interest", "democracy",
           "an ecosystem", "machine learning", "supply and demand", "a renewable resource", "irony", "a virus",
           "opportunity cost", "a simile", "the scientific method", "a budget deficit", "empathy", "entropy",
           "a food chain", "a carbon footprint", "the separation of powers", "an alliteration", "a prime number")

# category: (phrasings, {t} the topic and {u} a comparison's second item; topics; closers added to each)
CLOSERS = ("", " Keep it short.", " Explain it like I am ten years old.", " Use bullet points.",
           " Answer in two paragraphs.", " Give an example.", " Be concise.", " Use simple words.")
LIGHT_CLOSERS = ("", " Keep it short.", " Be concise.", " Please keep it under 100 words.")
CATEGORIES: dict[str, tuple[tuple[str, ...], tuple, tuple[str, ...]]] = {
    "explanation": (("Explain {t}.", "Can you explain {t} to me?", "Explain {t} in simple terms.",
                     "What should I know about {t}?"), _SCIENCE + _HISTORY, CLOSERS),
    "science": (("Explain the science of {t}.", "What do scientists know about {t}?", "Teach me the basics of {t}.",
                 "Give me three interesting facts about {t}."), _SCIENCE, CLOSERS),
    "history": (("Tell me about {t}.", "What were the consequences of {t}?", "What led to {t}?",
                 "Give me a short overview of {t}."), _HISTORY, CLOSERS),
    "how-to": (("How do I {t}?", "What are the steps to {t}?", "Give me a simple guide to {t}.",
                "What is the best way to {t}?"), _HOWTO, CLOSERS),
    "advice": (("{t}. What should I do?", "{t}. Do you have any advice?", "Can you help? {t}.",
                "{t}. How can I deal with this?"), _ADVICE, LIGHT_CLOSERS),
    "writing": (("Write {t}.", "Please write {t}.", "Can you write {t}?", "Draft {t}."), _WRITING, LIGHT_CLOSERS),
    "rewriting": (("Rewrite this sentence to sound more formal: \"{t}\"", "Fix the grammar in this sentence: \"{t}\"",
                   "Make this sentence shorter and clearer: \"{t}\"", "Rewrite this in a friendly, casual tone: \"{t}\"",
                   "Paraphrase this sentence: \"{t}\""), _REWRITE, ("",)),
    "list": (("List some {t}.", "Give me ten {t}.", "What are five {t}?", "Make a short list of {t}, with one line "
              "on each."), _LISTS, LIGHT_CLOSERS),
    "summary": (("Summarise {t}.", "Give me a short summary of {t}.", "What are the key points of {t}?",
                 "Summarise {t} in three sentences."), _SUMMARY, LIGHT_CLOSERS),
    "comparison": (("Compare {t} and {u}.", "What are the pros and cons of {t} versus {u}?",
                    "Which is better, {t} or {u}? Explain why.", "What is the difference between {t} and {u}?"),
                   _COMPARE, CLOSERS),
    "definition": (("What is {t}?", "Define {t} and give an example.", "What is meant by {t}?",
                    "Explain {t} in one paragraph."), _DEFINE, CLOSERS),
}


CHAT_SETS = {1: CATEGORIES, 2: CATEGORIES_2}  # a set, once a shard used it, never changes


def check_chat_set(chat_set: int) -> int:
    """``chat_set`` if it names one of ``CHAT_SETS``; else ValueError naming the choices."""
    if chat_set not in CHAT_SETS:
        raise ValueError(f"chat set {chat_set!r} does not exist: choose one of {sorted(CHAT_SETS)}")
    return chat_set


def all_topics() -> list[str]:
    """Every topic string of every category of every set (a comparison counts as its two items)."""
    out: list[str] = []
    for categories in CHAT_SETS.values():
        for _, topics, _ in categories.values():
            for t in topics:
                out += list(t) if isinstance(t, tuple) else [t]
    return out


def _render(phrase: str, topic) -> str:
    a, b = topic if isinstance(topic, tuple) else (topic, "")
    text = phrase.format(t=a, u=b)
    return text[0].upper() + text[1:]


def templated_chat_prompts(seed: int, chat_set: int = 1) -> list[tuple[str, str]]:
    """[(category, user text)]: every combination of phrasing, topic and closer of ``CHAT_SETS[chat_set]`` once,
    distinct, in an order fixed by ``seed`` (``random.Random(f"specdec-mix-chat-{seed}")``, the set's number added
    from the second on)."""
    check_chat_set(chat_set)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for name, (phrases, topics, closers) in CHAT_SETS[chat_set].items():
        for phrase in phrases:
            for topic in topics:
                for closer in closers:
                    text = _render(phrase, topic) + closer
                    if text not in seen:
                        seen.add(text)
                        out.append((name, text))
    random.Random(f"specdec-mix-chat-{seed}" + (f"-set{chat_set}" if chat_set > 1 else "")).shuffle(out)
    return out
