"""Each chapter opens with the diagram it teaches, and each numbered section says where it sits on it."""
import json
import re
from pathlib import Path

import pytest

from inference_course import chapter_maps
from inference_course.plotting import min_text_px, MIN_TEXT_PX

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


@pytest.mark.parametrize("chapter", [3, 4, 5, 6])  # 1 and 2 need the model; the notebooks draw them
def test_diagram_is_legible_svg_with_its_alt_text(chapter):
    fig = chapter_maps.figure(chapter)
    assert min_text_px(fig, svg=True)[0] >= MIN_TEXT_PX
    shown = chapter_maps.Diagram(chapter, fig)._repr_html_()
    assert shown.startswith('<div class="chapter-map"><img src="data:image/svg+xml;base64,')
    assert f'alt="{chapter_maps.ALT[chapter]}"'.replace("'", "&#x27;") in shown


def test_figure_refuses_an_unknown_chapter():
    with pytest.raises(ValueError, match="chapters are 1 to 6"):
        chapter_maps.figure(7)
