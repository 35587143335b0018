"""Watch speculative decoding work: a per-step trace of a run and its coloured rendering.

* :mod:`.trace` - :class:`Trace` (pass ``trace=Trace()`` to ``speculative_generate``) and :class:`TraceStep`;
* :mod:`.render` - HTML (notebooks) and ANSI (terminal) text: accepted drafts green, rejected drafts red and
  struck through, the target's correction or bonus token blue;
* :mod:`.app` - the notebook app (ipywidgets): prompt, drafter, K and temperature in, the trace and plain vs
  speculative tokens/s out.  Not imported here (it needs ipywidgets): ``from specdec_lesson.lab.app import build_app``.
"""

from .render import render_ansi, render_html, token_pieces
from .trace import Trace, TraceStep

__all__ = ["Trace", "TraceStep", "render_html", "render_ansi", "token_pieces"]
