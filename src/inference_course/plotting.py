"""One figure style for the whole book: text that stays legible at the page's width.

A cell's output is 688 px wide at 1280 px (the article column, 752 px, less the output's inset),
and a figure's image is shown at most that wide. A figure ``w`` inches wide at ``dpi`` is ``w * dpi`` px, so it is shrunk by
``COLUMN_PX / (w * dpi)`` when wider than the column; text of ``s`` points is ``s * dpi / 72`` px
before the shrink. ``min_text_px`` is what the reader finally sees, and ``check_legible``
refuses a figure whose smallest text falls under ``MIN_TEXT_PX`` (70% of the body's 16 px).

    from inference_course.plotting import use_book_style, check_legible
    use_book_style()            # once per notebook, before the first figure
    fig, ax = plt.subplots()    # the default size fits the column
    check_legible(fig)          # raises if any text would be too small on the page

A figure shown as SVG (the home page's diagrams) is laid out in points, which a browser shows at
96 px per inch whatever the figure's dpi: pass ``svg=True``.
"""
from __future__ import annotations

COLUMN_PX = 688       # a cell output's width at 1280 px (measured: the 752-px article, less the output's inset)
PHONE_PX = 358        # the article's width on a 390-px phone (the chapter diagrams' phone layouts, chapter_maps)
BODY_PX = 16
MIN_TEXT_PX = 0.7 * BODY_PX
DPI = 100
WIDTH_IN = 7.2        # 720 px: the column shows a default figure at 96% of its size

STYLE = {
    "figure.figsize": (WIDTH_IN, 3.6),
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 10,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "figure.titlesize": 11,
    "figure.constrained_layout.use": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def use_book_style() -> None:
    """Set matplotlib's defaults to the book's sizes (idempotent)."""
    import matplotlib as mpl

    mpl.rcParams.update(STYLE)


SVG_PX_PER_INCH = 96   # CSS pixels per inch: an SVG's width in points, shown by a browser


def _px_per_inch(fig, svg: bool) -> float:
    return SVG_PX_PER_INCH if svg else fig.dpi


def shown_scale(fig, svg: bool = False, column_px: float = COLUMN_PX) -> float:
    """How much the page shrinks ``fig``'s image: 1.0 when it fits the column."""
    width_px = fig.get_figwidth() * _px_per_inch(fig, svg)
    return min(1.0, column_px / width_px)


def min_text_px(fig, svg: bool = False, column_px: float = COLUMN_PX) -> tuple[float, str]:
    """The smallest visible text of ``fig`` as the reader sees it (px), and that text."""
    from matplotlib.text import Text

    # Tick labels get their text only when the figure is drawn: draw it, or they would be skipped.
    fig.canvas.draw()
    scale = shown_scale(fig, svg, column_px)
    smallest, which = float("inf"), ""
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip():
            continue
        px = t.get_fontsize() * _px_per_inch(fig, svg) / 72 * scale
        if px < smallest:
            smallest, which = px, t.get_text()
    return smallest, which


def check_legible(fig, min_px: float = MIN_TEXT_PX, svg: bool = False, column_px: float = COLUMN_PX) -> None:
    """Raise ValueError if any text in ``fig`` would be shown smaller than ``min_px`` pixels in a
    column ``column_px`` wide."""
    px, text = min_text_px(fig, svg, column_px)
    if px < min_px:
        raise ValueError(f"text {text[:40]!r} would be {px:.1f} px on the page (< {min_px:.1f} px): "
                         f"use a larger font or a narrower figure ({fig.get_figwidth():.1f} in wide)")
