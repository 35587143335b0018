"""Interactive apps of the course: sliders where the maths lives, one module per app.

* :mod:`.roofline` (notebook 00) - per-token time against the memory and compute roofs, and T(n)/T(1);
* :mod:`.speedup` (notebook 01) - S(K; alpha, c, verify cost), the best K, the region alpha <= c shaded;
* :mod:`.residual` (notebook 01) - a 3-token p / q editor: accepted mass, residual, the emitted law (= p, exactly);
* :mod:`.tree_shape` (notebook 04) - an EAGLE-2 tree's shape (top-k, depth, node budget), its accepted path and
  speedup against a chain.

Each module pairs a pure function computing what it draws (``roofline_view``, ``speedup_view``, ``residual_view``,
``tree_shape_view``: no widgets, so tests check their numbers) with a ``build_*`` function returning the app
(ipywidgets controls and plotly FigureWidgets as attributes; ``app.ui`` is the box to display and
``app.static_figure()`` the current state as one plain figure, for :func:`specdec_lesson.figures.show_static`).
ipywidgets and plotly, the course extra, are imported only when an app is built.
"""

from .residual import ResidualEditor, ResidualView, build_residual_editor, residual_view
from .roofline import RooflineExplorer, RooflineView, build_roofline_explorer, roofline_view
from .speedup import SpeedupExplorer, SpeedupView, build_speedup_explorer, ratio_function, speedup_view
from .tree_shape import TreeExplorer, TreeView, build_tree_explorer, rank_law, tree_shape_view

__all__ = [
    "RooflineView", "roofline_view", "RooflineExplorer", "build_roofline_explorer",
    "SpeedupView", "speedup_view", "ratio_function", "SpeedupExplorer", "build_speedup_explorer",
    "ResidualView", "residual_view", "ResidualEditor", "build_residual_editor",
    "TreeView", "tree_shape_view", "rank_law", "TreeExplorer", "build_tree_explorer",
]
