"""Copy the website's JavaScript from node_modules into book/_static_offline/.

The site must work with no network: the widgets embed bundle, MathJax and Pyodide are installed
from npm (`npm ci`, pinned by package-lock.json) and served from the site itself.
The destination is gitignored and is not a root `_static/` (Jupyter Book would inject
every .js file found there into every page).

    book/_static_offline/widgets/   embed.js + the font files it loads from its own folder
    book/_static_offline/mathjax/   tex-mml-chtml.js + the components it loads lazily
    book/_static_offline/pyodide/   Python in WebAssembly, for the code exercises graded in the
                                    browser (book/_static/code_exercises_worker.js): the runtime
                                    and the standard library, none of Pyodide's packages

Run by `make assets`; safe to re-run.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "node_modules"
DEST = ROOT / "book" / "_static_offline"

WIDGETS = NODE / "@jupyter-widgets" / "html-manager"
MATHJAX = NODE / "mathjax"
PYODIDE = NODE / "pyodide"
FONT_SUFFIXES = {".woff", ".woff2", ".ttf", ".eot", ".svg"}
# What tex-mml-chtml.js fetches after it starts: fonts, TeX extensions (autoload),
# the accessibility helpers and the context menu, and the speech rules they use.
MATHJAX_PARTS = ["tex-mml-chtml.js", "output/chtml", "input", "a11y", "ui", "sre"]
# What loadPyodide() fetches from its indexURL: the loader, the runtime, the standard library and
# the lock file it reads at start (it lists packages the site never loads). About 13 MiB.
PYODIDE_PARTS = ["pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json"]


def copy_widgets(dest: Path) -> None:
    dist = WIDGETS / "dist"
    dest.mkdir(parents=True)
    # The non-AMD bundle: it needs no require.js and finds its fonts beside itself.
    for name in ["embed.js", "embed.js.LICENSE.txt"]:
        shutil.copy2(dist / name, dest / name)
    fonts = [p for p in dist.iterdir() if p.suffix in FONT_SUFFIXES]
    if not fonts:
        raise SystemExit(f"no font files in {dist}: the package layout changed")
    for font in fonts:
        shutil.copy2(font, dest / font.name)


def copy_mathjax(dest: Path) -> None:
    es5 = MATHJAX / "es5"
    dest.mkdir(parents=True)
    for part in MATHJAX_PARTS:
        src = es5 / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        else:
            shutil.copy2(src, dest / part)
    shutil.copy2(MATHJAX / "LICENSE", dest / "LICENSE")


def copy_pyodide(dest: Path) -> None:
    dest.mkdir(parents=True)
    for name in PYODIDE_PARTS:
        shutil.copy2(PYODIDE / name, dest / name)


def main() -> int:
    missing = [p for p in (WIDGETS / "dist" / "embed.js", MATHJAX / "es5" / "tex-mml-chtml.js",
                           *(PYODIDE / name for name in PYODIDE_PARTS))
               if not p.exists()]
    if missing:
        print("missing " + ", ".join(str(p.relative_to(ROOT)) for p in missing)
              + ": run `npm ci` first (or `make assets`)", file=sys.stderr)
        return 1
    shutil.rmtree(DEST, ignore_errors=True)
    copy_widgets(DEST / "widgets")
    copy_mathjax(DEST / "mathjax")
    copy_pyodide(DEST / "pyodide")
    size = sum(p.stat().st_size for p in DEST.rglob("*") if p.is_file())
    print(f"offline assets: {DEST.relative_to(ROOT)} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
