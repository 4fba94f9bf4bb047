"""Source listings: short ones whole, long ones folded (inference_course.listing)."""
import inspect

import pytest

from inference_course import listing
from inference_internals import speculative
from inference_course.listing import source


def short_function(x):
    return x + 1


def test_a_short_listing_is_shown_whole():
    shown = source(short_function)
    assert not shown.folded and shown.lines == 2
    html = shown._repr_html_()
    assert "<details" not in html and "short_function" in html
    assert repr(shown) == inspect.getsource(short_function)


def test_a_long_listing_is_folded_with_its_names_and_length():
    shown = source(speculative.speculative_generate, short_function)
    assert shown.lines > listing.FOLD_LINES and shown.folded
    html = shown._repr_html_()
    assert html.startswith('<details class="listing">') and html.endswith("</details>")
    summary = html[:html.index("</summary>")]
    assert "speculative_generate" in summary and "short_function" in summary
    assert f"({shown.lines} lines)" in summary
    assert shown.text == inspect.getsource(speculative.speculative_generate) + "\n" + inspect.getsource(short_function)


def test_the_fold_threshold_is_a_parameter():
    assert source(short_function, fold_lines=1).folded
    assert not source(speculative.speculative_generate, fold_lines=10_000).folded


def test_nothing_to_show_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one"):
        source()
