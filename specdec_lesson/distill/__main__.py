"""``python -m specdec_lesson.distill``."""

import sys

from .cli import main

sys.exit(main())
