"""Free-form function requests: the benchmark's third prompt style, held out from every training set.

HumanEval-style prompts hand the model a signature and a docstring to complete; a user more often just asks.
Each item here is one such request in plain words ("Write a Python function ... that ..."), phrased in one of
several ways, for a small task written for this module (none is a HumanEval task, a standard-library function
or a distillation prompt; ``tests/test_tasks.py`` checks the last against ``distill.data``).  The order and the
phrasing come from a fixed seed, so the set is the same on every machine.

    from specdec_lesson.bench.requests import function_requests
    function_requests()[0]["text"]
"""

from __future__ import annotations

import random

__all__ = ["FUNCTION_IDEAS", "PHRASINGS", "function_requests"]

# (name, arguments, what it does): small tasks a user might ask for, written for this module.
FUNCTION_IDEAS: tuple[tuple[str, str, str], ...] = (
    ("count_vowels", "text", "returns how many vowels (a, e, i, o, u, either case) the string contains"),
    ("second_largest", "numbers", "returns the second largest distinct value in a list of integers, or None if there is none"),
    ("is_leap_year", "year", "tells whether a year is a leap year in the Gregorian calendar"),
    ("run_length_encode", "text", "compresses a string with run-length encoding, so 'aaabcc' becomes 'a3b1c2'"),
    ("chunk_list", "items, size", "splits a list into consecutive chunks of the given size, the last one possibly shorter"),
    ("celsius_table", "start, stop, step", "returns a list of (celsius, fahrenheit) pairs from start to stop inclusive"),
    ("word_frequencies", "text", "returns a dictionary mapping each lower-cased word of a sentence to how often it occurs"),
    ("flatten_once", "nested", "flattens a list of lists by one level"),
    ("rotate_left", "items, k", "rotates a list k places to the left, wrapping around, for any k >= 0"),
    ("caesar_shift", "text, shift",
     "shifts every letter of a string by a fixed amount in the alphabet, keeping case and leaving other characters alone"),
    ("median_of", "values", "returns the median of a non-empty list of numbers"),
    ("digits_sum", "n", "adds up the decimal digits of a non-negative integer"),
    ("merge_sorted", "a, b", "merges two already sorted lists into one sorted list without calling sort"),
    ("longest_word", "sentence", "returns the longest word of a sentence, the first one if several tie"),
    ("is_anagram", "first, second", "checks whether two strings are anagrams of each other, ignoring spaces and case"),
    ("moving_average", "values, window", "returns the list of averages of every window of consecutive values"),
    ("title_case", "text", "capitalises the first letter of every word and lower-cases the rest"),
    ("count_islands", "grid", "counts the groups of connected 1s (up, down, left, right) in a grid of 0s and 1s"),
    ("binary_to_int", "bits", "converts a string of 0s and 1s to the integer it represents, without using int(bits, 2)"),
    ("dedupe_keep_order", "items", "removes repeated elements from a list while keeping the first occurrence of each in order"),
    ("pairs_with_sum", "numbers, target", "returns every pair of positions (i, j), i < j, whose values add up to the target"),
    ("format_duration", "seconds", "turns a number of seconds into a string like '2h 05m 09s'"),
    ("is_palindrome_number", "n", "tells whether an integer reads the same backwards, without converting it to a string"),
    ("transpose", "matrix", "returns the transpose of a rectangular matrix given as a list of rows"),
    ("count_words_longer_than", "text, n", "counts the words of a string that have more than n letters"),
    ("safe_divide", "a, b", "divides a by b and returns None instead of raising when b is zero"),
    ("nth_fibonacci", "n", "returns the n-th Fibonacci number iteratively, with fib(0) = 0 and fib(1) = 1"),
    ("parse_key_values", "text", "parses a string like 'a=1;b=2' into a dictionary of strings"),
    ("clamp", "value, low, high", "limits a number to the closed range from low to high"),
    ("initials", "full_name", "returns the upper-case initials of a name, so 'ada lovelace' gives 'AL'"),
    ("matrix_trace", "matrix", "returns the sum of the diagonal of a square matrix"),
    ("prime_factors", "n", "returns the prime factors of an integer greater than 1, in increasing order, with repeats"),
    ("group_by_length", "words", "groups words into a dictionary keyed by their length"),
    ("balanced_brackets", "text", "checks that the (), [] and {} brackets in a string are balanced and properly nested"),
    ("running_max", "values", "returns a list whose i-th entry is the largest of the first i + 1 values"),
    ("mask_email", "address",
     "hides an e-mail address except its first letter and its domain, so 'jane@x.org' gives 'j***@x.org'"),
    ("days_in_month", "year, month", "returns how many days a month has, leap years included"),
    ("weave_lists", "a, b", "interleaves two lists, appending what is left of the longer one at the end"),
    ("hamming_distance", "first, second", "counts the positions at which two strings of equal length differ"),
    ("top_k_frequent", "items, k", "returns the k most common elements of a list, most common first"),
    ("snake_to_camel", "name", "converts a snake_case identifier to camelCase"),
    ("count_inversions", "numbers", "counts the pairs i < j with numbers[i] > numbers[j]"),
    ("scale_recipe", "ingredients, factor", "multiplies every quantity in a dictionary of ingredient amounts by a factor"),
    ("is_power_of_two", "n", "tells whether a positive integer is a power of two"),
    ("histogram_string", "counts", "draws a text histogram, one line of '*' per entry of a dictionary of counts"),
    ("next_weekday", "day", "returns the name of the day after the given weekday name"),
    ("gcd_list", "numbers", "returns the greatest common divisor of a non-empty list of positive integers"),
    ("strip_comments", "source", "removes everything after a '#' on each line of a string of Python-like code"),
)

PHRASINGS: tuple[str, ...] = (
    "Write a Python function `{name}({args})` that {what}.",
    "I need a Python function called {name} that takes {args} and {what}. Please include a short docstring.",
    "Can you implement `{name}({args})` in Python? It {what}.",
    "Write {name}({args}) in Python: it {what}. Reply with the code in one Python code block.",
)
SEED = "specdec-function-requests"


def function_requests() -> list[dict]:
    """The held-out free-form requests: dicts with ``id`` (``request-000`` ..), ``name`` and ``text`` (the user
    message), one per idea, each phrased by a seeded choice of ``PHRASINGS``, in a seeded order."""
    rng = random.Random(SEED)  # string seed: stable across runs and platforms
    ideas = list(FUNCTION_IDEAS)
    rng.shuffle(ideas)
    out = []
    for i, (name, args, what) in enumerate(ideas):
        text = PHRASINGS[rng.randrange(len(PHRASINGS))].format(name=name, args=args, what=what)
        out.append({"id": f"request-{i:03d}", "name": name, "text": text})
    return out
