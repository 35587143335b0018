"""The second set of templated chat prompts (``mix --chat-set 2``): new subjects and new phrasings.

The first set (``distill.chat_prompts``, 6923 prompts) was used up by the mixture's seeds 0 and 1; a draft trained
on its answers gained 0.018 of held-out chat acceptance, and a seed without templated chat gained none.  This set
asks what the first never does: "why" questions about everyday things, how things around us work, new how-to
tasks and situations, plans and recommendations, arguments for and against, short pieces of writing and
sentences to rewrite, in a more conversational voice (a beginner asking, a reason given, a format wanted).  None
of its subjects is one of the first set's, and none appears in a held-out prompt (``tests/test_mixture.py``).
"""

from __future__ import annotations

__all__ = ["CATEGORIES_2"]

_WHY = ("the sea is salty", "onions make people cry", "cats purr", "ice floats on water", "we get hiccups",
        "the sky turns red at sunset", "popcorn pops", "our fingers wrinkle in the bath", "we yawn",
        "metal feels colder than wood", "some people are left-handed", "we dream", "the moon looks bigger near the "
        "horizon", "dogs wag their tails", "leap years exist", "airplanes leave white trails in the sky",
        "soap removes grease", "hot air balloons float", "chilli peppers taste hot", "our ears pop on a plane",
        "the desert gets cold at night", "birds fly south for the winter", "bubbles are round", "glass is transparent",
        "some animals hibernate", "mountains have snow on top", "we get goosebumps", "flamingos are pink",
        "a spoon looks bent in a glass of water", "salt melts ice on roads")
_WORKS = ("a refrigerator keeps food cold", "credit cards work", "GPS finds my location", "a bill becomes a law",
          "a microwave oven heats food", "touch screens sense a finger", "an elevator knows where to stop",
          "a compass points north", "a search engine ranks pages", "a dishwasher cleans plates", "wifi sends data "
          "through the air", "a thermostat controls the heating", "a camera captures a photo",
          "the votes in an election are counted",
          "a lock opens with a key", "plastic bottles are recycled", "a hybrid car saves fuel", "a smoke alarm "
          "detects smoke", "a bank lends money", "an insurance policy pays out", "a 3D printer builds an object",
          "a QR code stores information", "a vaccine trial is run", "a library lends e-books", "a barcode is read at "
          "the supermarket checkout", "a jet engine pushes a plane forward", "a submarine dives and surfaces",
          "a heat pump warms a house", "a water filter cleans water", "a password manager keeps passwords safe")
_TASKS = ("learn to juggle three balls", "make homemade pizza dough", "keep a journal every day",
          "negotiate the price of a used car", "teach an old dog a new trick", "get rid of fruit flies in the kitchen",
          "write a good thesis statement", "keep a conversation going with a stranger", "build a simple bookshelf",
          "start composting in a small flat", "improve my chess", "choose a good watermelon", "fold a fitted sheet",
          "get better at mental arithmetic", "pack a suitcase efficiently", "remove a red wine stain from a carpet",
          "learn to touch type", "grow herbs on a windowsill", "make a short film with my phone",
          "stay warm while camping in autumn", "prepare a simple vegetable curry", "run a productive team meeting",
          "quit a bad habit", "keep track of my spending", "wake up earlier without feeling tired")
_SITUATIONS = ("my best friend forgot my birthday", "I failed my driving test for the second time",
               "I have too many subscriptions and want to cut back", "my neighbour plays loud music late at night",
               "I am moving abroad and do not speak the language", "my child does not want to read",
               "I have three deadlines on the same day", "I want to change careers at forty",
               "I keep losing my keys", "I was asked to give a toast at short notice",
               "my laptop is slow and I cannot afford a new one", "I feel burnt out at work",
               "I want to start volunteering but do not know where", "I lent money to a friend who has not paid it back",
               "my parents want me to study medicine but I love art", "I have a long commute every day",
               "I cannot decide what to cook for dinner every night", "I want to learn to swim as an adult",
               "my group project partner does no work", "I want to host my first dinner party")
_PIECES = ("a short toast for a colleague's retirement", "a two-sentence horror story", "an acrostic poem for the word "
           "SPRING", "a polite complaint to a hotel about a noisy room", "a welcome message for new club members",
           "a short bedtime story about a brave turtle", "an out-of-office email reply", "a riddle with its answer",
           "a list of interview questions for a baker", "a farewell card for a classmate", "a short advert for a "
           "second-hand sofa", "a sonnet about a rainy city", "a message asking a landlord to fix the heating",
           "the first line of a fantasy novel", "a short speech to open a school science fair",
           "a note reminding flatmates to take out the bins", "a thank-you email after a job interview",
           "a funny dialogue between a pencil and an eraser", "a short diary entry of a pirate",
           "a motivational quote about patience")
_PLANS = ("a three-day trip to Lisbon", "a week of healthy packed lunches", "a study timetable for final exams",
          "a birthday party for a six-year-old", "a beginner's strength training week", "a family board-game night",
          "a budget for a student living alone", "a day out in a new city on foot", "a reading list for a curious "
          "teenager", "a small garden for a shady yard", "a first visit to an art museum", "a weekly cleaning rota",
          "a vegetarian dinner for eight guests", "a cycle of 10-minute lessons to learn Spanish", "a relaxing "
          "Sunday without screens")
_DEBATES = ("school uniforms", "a four-day working week", "banning cars from city centres", "homework for young "
            "children", "nuclear power", "zoos", "working from home", "a universal basic income", "space exploration",
            "tipping in restaurants", "social media for teenagers", "learning Latin at school",
            "daylight saving time", "free public transport", "self-driving cars", "year-round schooling",
            "lowering the voting age to sixteen", "paper books in the digital age", "fast fashion",
            "team sports being compulsory at school")
_SENTENCES = ("Me and him goes to the gym every mornings before work.",
              "Please be advised that the parking lot will be closed for resurfacing all weekend.",
              "The new software is more faster and more easier to use then the old one.",
              "yo the party's at 8, bring snacks n stuff",
              "Notwithstanding the aforementioned considerations, the committee has resolved to postpone its decision.",
              "I seen that film last week and it were really boring.",
              "Our team achieved a significant increase in customer satisfaction during the last quarter.",
              "Dear sir, I am writing to you to tell you that I am not happy.",
              "The museum's new exhibition features paintings from over forty artists across three centuries.",
              "Their going to announce the winners tomorrow, so dont forget to check.",
              "The quick decision by the referee changed the outcome of the whole match.",
              "In order to be able to access the building, visitors are required to sign in at reception.",
              "Everybody in the class have finished they're project on time.",
              "The festival attracts thousands of visitors who come to enjoy music, food and dancing.",
              "We will be conducting maintenance on the servers between midnight and two in the morning.")

# the closers of this set: a voice, a reason or a format (the first set's are other words)
CHATTY = ("", " I'm a complete beginner.", " Please give me a quick answer.", " Write it as a numbered list.",
          " I need this for a school project.", " A short paragraph is enough.", " Include one practical tip.",
          " Answer as if talking to a friend.")
BRIEF = ("", " Keep it brief, please.", " Just the main points.", " Thanks in advance!")

# category: (phrasings, topics, closers), as ``chat_prompts.CATEGORIES``
CATEGORIES_2: dict[str, tuple[tuple[str, ...], tuple, tuple[str, ...]]] = {
    "why": (("Why is it that {t}?", "Can you tell me why {t}?", "I've always wondered why {t}. What's the reason?",
             "Explain briefly why {t}.", "How come {t}?"), _WHY, CHATTY),
    "how-it-works": (("Explain how {t}.", "Can you walk me through how {t}?", "I'd like to understand how {t}.",
                      "Describe, step by step, how {t}."), _WORKS, CHATTY),
    "how-to": (("I want to {t}. Where do I start?", "What's a good way to {t}?", "Any tips on how to {t}?",
                "Could you give me a plan to {t}?"), _TASKS, BRIEF),
    "advice": (("Help me out: {t}.", "{t}. What would you do?", "I need some advice: {t}.",
                "Here's my problem: {t}. Any ideas?"), _SITUATIONS, BRIEF),
    "writing": (("Could you write {t} for me?", "I need {t}. Can you help?", "Come up with {t}.",
                 "Write {t}, please."), _PIECES, BRIEF),
    "plan": (("Plan {t}.", "Help me put together {t}.", "Suggest {t}.", "Can you outline {t}?"), _PLANS, BRIEF),
    "debate": (("What are the arguments for and against {t}?", "Give me both sides of the debate on {t}.",
                "Weigh up the case for and against {t}.", "What do supporters and critics say about {t}?"), _DEBATES, CHATTY),
    "rewriting": (("Correct the mistakes in this: \"{t}\"", "Say this in plain English: \"{t}\"",
                   "Turn this into a formal sentence: \"{t}\"", "Make this sound friendlier: \"{t}\"",
                   "Shorten this sentence: \"{t}\""), _SENTENCES, ("",)),
}
