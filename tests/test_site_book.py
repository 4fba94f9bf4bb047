"""The chapters read as a book on the built website: each opens with its diagram, stays short, shows
more prose than code, and fits its equations to the column.

Needs `_build/html` (`make book`) and Debian's Chromium, like tests/test_site.py, whose tabs it
shares (test_site.shared_page: these tests only read the page). Per chapter, at desktop and phone width:

- the page's height in screens (page height ÷ the window's height) and the share of it that is
  code (the visible code cells and source listings); at 1280 px each chapter is at most
  MAX_SCREENS screens and at most MAX_CODE_SHARE code;
- the first screen holds the chapter's diagram, and every numbered section's heading is followed
  by the diagram's strip with that section's stages lit;
- every display equation fits the column at 1280 px; at 390 px a wider one scrolls with a cue;
- at 390 px nothing but code is wider than the column or scrolls sideways (test_phone_fits_the_width).

The measures go to _build/screenshots/book-measures/ (one file per page and width) and the first screen of each chapter to
_build/screenshots/first-screen-*.png, for a person to look at.

    .venv/bin/python -m pytest tests/test_site_book.py -m browser -p no:xdist
"""
from __future__ import annotations

import json

import pytest

from test_site import NOT_PAGES, SCREENS, SHOTS, SITE, shared_page

pytestmark = pytest.mark.browser

# Issue 31's targets: 20 screens at 1280 px, 25 for chapter 5 (the longest); every chapter meets them.
MAX_SCREENS_DEFAULT = 20
MAX_SCREENS = {"chapters/05_paged_attention.html": 25}
MAX_CODE_SHARE = 0.20


def chapter_pages() -> list[str]:
    return sorted(p.relative_to(SITE).as_posix() for p in (SITE / "chapters").glob("*.html")) \
        if (SITE / "chapters").is_dir() else []


MEASURE_JS = r"""() => {
  const article = document.querySelector('article.bd-article');
  // A closed <details> still lays out its content in Chromium (content-visibility), so ask it.
  const folded = el => { for (let d = el.closest('details'); d; d = d.parentElement.closest('details'))
                           if (!d.open) return true;
                         return false; };
  const visible = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden' && !folded(el);
  const height = el => visible(el) ? el.getBoundingClientRect().height : 0;
  // Code on the page: code cells' inputs, and the source listings shown in HTML outputs (printed
  // text, a stream output, is not code). A folded input (hide-input) or a closed listing has no
  // box, so it counts 0.
  const code = [...article.querySelectorAll('.cell_input, .cell_output .text_html div.highlight')]
    .filter(el => !el.parentElement.closest('.cell_input, .cell_output .text_html div.highlight'));
  const sections = [...article.querySelectorAll('section[id] > h2')]
    .filter(h => /^\s*\d+\./.test(h.textContent) && !/Exercises/.test(h.textContent))
    .map(h => {
      const next = h.nextElementSibling;
      return {title: h.textContent.replace(/#\s*$/, '').trim(),
              strip: !!(next && next.matches('.stage-strip')), lit: next ? next.querySelectorAll('b').length : 0};
    });
  // The diagram the reader sees: the column's, or under 720 px its phone layout.
  const map = [...article.querySelectorAll('.chapter-map img')].find(visible) || null;
  const mapTop = map ? map.getBoundingClientRect().top + window.scrollY : null;
  const math = [...article.querySelectorAll('div.math mjx-container, mjx-container[display="true"]')]
    .filter((el, i, all) => all.indexOf(el) === i && visible(el))
    .map(el => {
      const style = getComputedStyle(el);
      const column = el.closest('div.math, .cell_output, p, li') || article;
      return {tex: (el.closest('div.math') || el).textContent.slice(0, 60),
              width: el.scrollWidth, shown: el.clientWidth,
              column: Math.round(column.getBoundingClientRect().width),
              scrolls: ['auto', 'scroll'].includes(style.overflowX),
              cue: /gradient/.test(style.backgroundImage)};
    });
  return {page: document.documentElement.scrollHeight, article: article.getBoundingClientRect().height,
          code: code.reduce((s, el) => s + height(el), 0), window: window.innerHeight,
          sections, mapTop, mapLoaded: !!(map && map.complete && map.naturalWidth > 0), math};
}"""


def measure(open_tabs, browser, server, page: str, width_name: str) -> dict:
    width, height = SCREENS[width_name]
    pg, problems = shared_page(open_tabs, browser, server, page, width, height)
    info = pg.evaluate(MEASURE_JS)
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"first-screen-{page.split('/')[-1].removesuffix('.html')}-{width}.png"))
    info["problems"] = problems
    info["screens"] = info["page"] / info["window"]
    info["code_share"] = info["code"] / info["article"]
    return info


def record(page: str, width_name: str, info: dict) -> None:
    """One file per page and width: the browser tests run in several processes at once, and one
    shared file read and rewritten by each would be read half-written by another."""
    folder = SHOTS / "book-measures"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{page.split('/')[-1].removesuffix('.html')}-{width_name}.json"
    (folder / name).write_text(json.dumps({"page": page, "width": width_name, "screens": round(info["screens"], 1),
                                           "code_share": round(info["code_share"], 3)}, indent=1))


@pytest.mark.parametrize("width_name", list(SCREENS))
@pytest.mark.parametrize("page", chapter_pages() or ["<no site built>"])
def test_chapter_reads_as_a_book(server, browser, open_tabs, page, width_name):
    info = measure(open_tabs, browser, server, page, width_name)
    record(page, width_name, info)
    problems = list(info["problems"])
    width = SCREENS[width_name][0]
    if width_name == "desktop":
        limit = MAX_SCREENS.get(page, MAX_SCREENS_DEFAULT)
        if info["screens"] > limit:
            problems.append(f"{info['screens']:.1f} screens at {width} px (at most {limit})")
        if info["code_share"] > MAX_CODE_SHARE:
            problems.append(f"code is {info['code_share']:.0%} of the page's height (at most {MAX_CODE_SHARE:.0%})")
    if not info["mapLoaded"]:
        problems.append("no chapter diagram (.chapter-map img) loaded")
    elif info["mapTop"] > info["window"] * 0.75:
        problems.append(f"the chapter's diagram starts {info['mapTop']:.0f} px down: not on the first screen")
    if not info["sections"]:
        problems.append("no numbered section")
    problems += [f"section {s['title']!r} has no map strip under its heading" for s in info["sections"]
                 if not (s["strip"] and s["lit"])]
    assert not problems, f"{page} at {width} px:\n  " + "\n  ".join(problems)


def site_pages_with_math() -> list[str]:
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")
                  if p.relative_to(SITE).parts[0] not in NOT_PAGES and 'class="math' in p.read_text()) \
        if SITE.is_dir() else []


@pytest.mark.parametrize("width_name", list(SCREENS))
@pytest.mark.parametrize("page", site_pages_with_math() or ["<no site built>"])
def test_display_math_fits(server, browser, open_tabs, page, width_name):
    """Every display equation fits its column at 1280 px; at 390 px a wider one scrolls, with a cue."""
    width, height = SCREENS[width_name]
    pg, problems = shared_page(open_tabs, browser, server, page, width, height)
    math = pg.evaluate(MEASURE_JS)["math"]
    for m in math:
        overflow = m["width"] - m["shown"]
        if width_name == "desktop" and (overflow > 1 or m["width"] > m["column"] + 1):
            problems.append(f"equation {m['tex']!r} is {m['width']} px wide in a {m['column']} px column")
        elif overflow > 1 and not (m["scrolls"] and m["cue"]):
            problems.append(f"equation {m['tex']!r} overflows by {overflow} px with no scroll cue")
    assert not problems, f"{page} at {width} px:\n  " + "\n  ".join(problems)


# Phones: everything a reader must read fits the 390-px screen. A chapter diagram is drawn a second time
# for a phone's column (chapter_maps), a table too wide becomes one block per row (book/_static/narrow.js),
# printed text wraps and long equations are split across lines. Only code keeps its lines and scrolls
# inside its own box (with a cue, tests/test_site.py).
PHONE_FIT_JS = r"""() => {
  const article = document.querySelector('article.bd-article');
  const col = article.getBoundingClientRect();
  const folded = el => { for (let d = el.closest('details'); d; d = d.parentElement.closest('details'))
                           if (!d.open) return true;
                         return false; };
  const visible = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden' && !folded(el);
  const code = el => el.closest('.cell_input, .cell_output .text_html div.highlight, textarea, ' +
                                '.code-exercise-browser, mjx-assistive-mml');
  const name = el => el.tagName.toLowerCase() + [...el.classList].slice(0, 2).map(c => '.' + c).join('');
  const where = el => { const s = el.closest('section[id]'); return `${name(el)} in ${s ? '#' + s.id : 'the page'}`; };
  const wide = [], hidden = [];
  for (const el of article.querySelectorAll('*')) {
    if (code(el) || !visible(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.right > col.right + 1 || r.left < col.left - 1) && !el.parentElement.closest('[data-phone-wide]')) {
      el.dataset.phoneWide = '1';   // the outermost only
      wide.push(`${where(el)}: ${Math.round(r.width)} px wide, ${Math.round(r.left - col.left)}..${Math.round(r.right - col.left)} of a ${Math.round(col.width)} px column`);
    }
    const overflow = el.scrollWidth - el.clientWidth;
    if (overflow > 1 && ['auto', 'scroll'].includes(getComputedStyle(el).overflowX))
      hidden.push(`${where(el)}: ${el.scrollWidth} px of content in ${el.clientWidth} (${(el.textContent || '').trim().slice(0, 50)})`);
  }
  return {wide, hidden, page: document.documentElement.scrollWidth - window.innerWidth};
}"""


@pytest.mark.parametrize("page", chapter_pages() or ["<no site built>"])
def test_phone_fits_the_width(server, browser, open_tabs, page):
    """At 390 px nothing but code is wider than the column or hides part of itself in a sideways scroll."""
    width, height = SCREENS["phone"]
    pg, problems = shared_page(open_tabs, browser, server, page, width, height)
    info = pg.evaluate(PHONE_FIT_JS)
    if info["page"] > 1:
        problems.append(f"the page scrolls sideways by {info['page']} px")
    problems += [f"wider than the column: {w}" for w in info["wide"][:15]]
    problems += [f"scrolls sideways: {h}" for h in info["hidden"][:15]]
    assert not problems, f"{page} at {width} px ({len(info['wide'])} too wide, {len(info['hidden'])} scrolling):\n  " \
        + "\n  ".join(problems)
