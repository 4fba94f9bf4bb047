"""The book's figure style and its legibility check (inference_course.plotting)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from inference_course import plotting  # noqa: E402
from inference_course.plotting import check_legible, min_text_px, use_book_style  # noqa: E402


@pytest.fixture(autouse=True)
def book_style():
    with matplotlib.rc_context():
        use_book_style()
        yield
    plt.close("all")


def labelled(fig):
    for ax in fig.axes:
        ax.plot([0, 1], [2, 3], label="line")
        ax.set(xlabel="x", ylabel="y", title="title")
        ax.legend()
    return fig


def test_default_figure_fits_the_column_and_passes():
    fig = labelled(plt.figure())
    fig.add_subplot()
    labelled(fig)
    assert plotting.shown_scale(fig) == pytest.approx(plotting.COLUMN_PX / (plotting.WIDTH_IN * plotting.DPI))
    check_legible(fig)
    px, _ = min_text_px(fig)
    assert px >= plotting.MIN_TEXT_PX


def test_two_panels_side_by_side_at_the_default_size_pass():
    fig, _ = plt.subplots(1, 2)
    check_legible(labelled(fig))


@pytest.mark.parametrize("size", [8, 6.5])
def test_small_text_is_refused_and_named(size):
    fig, ax = plt.subplots()
    labelled(fig)
    ax.text(0.5, 2.5, "tiny note", fontsize=size)
    with pytest.raises(ValueError, match="tiny note"):
        check_legible(fig)


def test_small_tick_labels_are_found_although_set_only_at_draw_time():
    fig, ax = plt.subplots()
    labelled(fig)
    ax.tick_params(labelsize=6)
    with pytest.raises(ValueError, match="px on the page"):
        check_legible(fig)


def test_a_wide_figure_is_shrunk_to_the_column_and_refused():
    # 9-point ticks are legible at full size; shrunk from 12 in to the column they are not
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    labelled(fig)
    assert plotting.shown_scale(fig) == pytest.approx(plotting.COLUMN_PX / 1200)
    with pytest.raises(ValueError, match="12.0 in wide"):
        check_legible(fig)


def test_hidden_and_empty_text_is_ignored():
    fig, ax = plt.subplots()
    labelled(fig)
    ax.text(0.5, 2.5, "hidden", fontsize=4, visible=False)
    ax.text(0.5, 2.5, "  ", fontsize=4)
    check_legible(fig)


def test_svg_figures_are_measured_at_96_px_per_inch():
    # An SVG is laid out in points and shown at 96 px per inch, whatever the figure's dpi.
    fig = plt.figure(figsize=(9, 3), dpi=300)
    fig.text(0.1, 0.5, "label", fontsize=11)
    px, _ = min_text_px(fig, svg=True)
    assert px == pytest.approx(11 * 96 / 72 * plotting.COLUMN_PX / (9 * 96))
    check_legible(fig, svg=True)  # 11.7 px once 864 px are shrunk to the column
    fig.texts[0].set_fontsize(10)
    with pytest.raises(ValueError):
        check_legible(fig, svg=True)
