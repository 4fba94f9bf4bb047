"""Each chapter opens with the diagram it teaches, and each numbered section says where it sits on it."""
import json
import re
from pathlib import Path

import pytest

from inference_course import chapter_maps
from inference_course.plotting import MIN_TEXT_PX, PHONE_PX, SVG_PX_PER_INCH, min_text_px

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("0*.ipynb"))
STRIP = re.compile(r'^<div class="stage-strip" data-chapter="(\d)" data-stages="([a-z ]+)">.*</div>$')


def cells(path):
    return json.loads(path.read_text())["cells"]


def source(cell):
    return "".join(cell["source"])


def test_there_is_a_map_for_every_chapter():
    assert [int(p.name[:2]) for p in CHAPTERS] == sorted(chapter_maps.STAGES) == sorted(chapter_maps.ALT)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_opens_with_its_diagram(path):
    n = int(path.name[:2])
    first, second = cells(path)[:2]
    assert first["cell_type"] == "markdown" and source(first).startswith(f"# Chapter {n} ")
    assert second["cell_type"] == "code" and f"chapter_maps.show({n})" in source(second)
    assert "remove-input" in second["metadata"].get("tags", [])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_numbered_section_has_its_strip(path):
    """Under each '## N.' heading (exercises aside), the strip that chapter_maps.strip makes for
    the stages it names: a section cannot name a stage the diagram lacks, nor drift from STAGES."""
    n = int(path.name[:2])
    sections = 0
    for cell in cells(path):
        if cell["cell_type"] != "markdown":
            continue
        lines = source(cell).split("\n")
        for i, line in enumerate(lines):
            if re.match(r"## \d+\. ", line) and "Exercises" not in line:
                sections += 1
                strip = lines[i + 2] if i + 2 < len(lines) else ""
                m = STRIP.match(strip)
                assert lines[i + 1] == "" and m, f"{line!r} has no map strip under it"
                assert int(m.group(1)) == n
                assert strip == chapter_maps.strip(n, *m.group(2).split()), line
    assert sections >= 4


def test_strip_refuses_a_stage_the_diagram_lacks():
    with pytest.raises(ValueError, match="stages are"):
        chapter_maps.strip(3, "decoding")
    with pytest.raises(ValueError):
        chapter_maps.strip(3)


def test_strip_lights_the_named_stages_in_the_diagram_order():
    html = chapter_maps.strip(5, "sharing", "blocks")
    assert 'data-stages="blocks sharing"' in html
    assert re.findall(r"<b>([^<]+)</b>", html) == ["Blocks", "Sharing"]
    assert html.count("<span>") == len(chapter_maps.STAGES[5]) - 2


@pytest.mark.parametrize("chapter", [1, 3, 4, 5, 6, 7])  # 2 needs the model; the notebooks draw it
def test_diagram_is_legible_svg_with_its_alt_text(chapter):
    wide, phone = chapter_maps.figures(chapter)
    assert min_text_px(wide, svg=True)[0] >= MIN_TEXT_PX
    # The phone layout fits a phone's column at full size: legible without zooming, no sideways scroll.
    assert phone.get_figwidth() * SVG_PX_PER_INCH <= PHONE_PX
    assert min_text_px(phone, svg=True, column_px=PHONE_PX)[0] >= MIN_TEXT_PX
    shown = chapter_maps.Diagram(chapter, wide, phone)._repr_html_()
    assert shown.startswith('<div class="chapter-map"><img class="chapter-map-wide" src="data:image/svg+xml;base64,')
    # Jupyter has no course.css: the phone layout must start hidden there.
    assert '<img class="chapter-map-phone" src="data:image/svg+xml;base64,' in shown
    assert shown.count('style="display:none"') == 1
    assert shown.count(f'alt="{chapter_maps.ALT[chapter]}"'.replace("'", "&#x27;")) == 2


def test_phone_layout_refuses_text_too_small_for_a_phone():
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7.2, 3))  # a column-wide figure squeezed into a phone's column
    fig.text(0.5, 0.5, "label", fontsize=10)
    with pytest.raises(ValueError, match="too small|px on the page"):
        chapter_maps.Diagram(3, chapter_maps.figure(3), fig)
    plt.close(fig)


def test_chapter2_run_is_the_chapters_question():
    """The chapter's text names 'What is RAG?' and five steps: the drawing's run is that question."""
    assert chapter_maps.RUN_MESSAGES[-1] == {"role": "user", "content": "What is RAG?"}


def test_figure_refuses_an_unknown_chapter():
    with pytest.raises(ValueError, match="chapters are 1 to 7"):
        chapter_maps.figure(8)
