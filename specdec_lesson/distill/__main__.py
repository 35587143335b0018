"""``python -m specdec_lesson.distill``."""

from .cli import main

main()
