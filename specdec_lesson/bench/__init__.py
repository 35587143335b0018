"""Benchmark suite: tasks (HumanEval code, generated math, user prompts), runner, metrics, report, CLI.

Run ``python -m specdec_lesson.bench --help``.
"""
