// Narrow screens (phones): what does not fit the column is made to fit, instead of scrolling sideways
// with half of it out of sight.
// - A table wider than its column becomes one block per row, each cell under its column's name
//   (course.css, `table.ii-rows`). Tables that fit keep their layout; widgets' tables are theirs.
// - A formula wider than its column (MathJax 3 cannot break lines) is scaled down to fit, to no less
//   than MIN_MATH_SCALE; one that would need more keeps its size and scrolls in its own box, with the
//   cue of course.css (`.ii-math-scroll`). Long display equations are split in the pages' TeX instead.
(() => {
  const NARROW = window.matchMedia("(max-width: 720px)");
  const MIN_MATH_SCALE = 0.7;   // 16-px text at 0.7 of MathJax's 113% is 12.7 px: still legible

  function label(table) {
    if (table.dataset.iiLabelled) return true;
    const rows = [...table.rows];
    const head = table.tHead && table.tHead.rows.length ? table.tHead.rows[table.tHead.rows.length - 1]
      : rows.length && [...rows[0].cells].every(c => c.tagName === "TH") ? rows[0] : null;
    if (!head || rows.length < 2) return false;
    const names = [];
    for (const cell of head.cells) {
      for (let k = 0; k < (cell.colSpan || 1); k++) names.push(cell.textContent.trim());
    }
    if (!table.tHead) head.classList.add("ii-rows-head");
    for (const row of rows) {
      if (row === head || (table.tHead && row.parentElement === table.tHead)) continue;
      let col = 0;
      for (const cell of row.cells) {
        cell.dataset.label = names[col] || "";
        col += cell.colSpan || 1;
      }
    }
    table.dataset.iiLabelled = "1";
    return true;
  }

  function fitTables(article) {
    for (const table of article.querySelectorAll("table")) {
      if (table.closest(".ii-widget, .jupyter-widgets, .widget-subarea, .chapter-map")) continue;
      table.classList.remove("ii-rows");
      if (!NARROW.matches) continue;
      const box = table.parentElement;
      const column = Math.min(box.clientWidth || article.clientWidth, article.clientWidth);
      if (table.scrollWidth > column + 1 && label(table)) table.classList.add("ii-rows");
    }
  }

  function fitMath(article) {
    for (const math of article.querySelectorAll("mjx-container")) {
      if (math.closest(".cell_input, mjx-assistive-mml, .ii-widget")) continue;
      if (!("iiFont" in math.dataset)) math.dataset.iiFont = math.style.fontSize || "";
      math.style.fontSize = math.dataset.iiFont;
      math.classList.remove("ii-math-scroll");
      if (!NARROW.matches) continue;
      const column = (math.closest("div.math, p, li, td, th, dd, div") || article).clientWidth;
      const inner = math.querySelector("mjx-math") || math;
      const width = Math.max(inner.getBoundingClientRect().width, inner.scrollWidth);
      if (!column || width <= column) continue;
      const scale = (column - 2) / width;
      if (scale < MIN_MATH_SCALE) { math.classList.add("ii-math-scroll"); continue; }
      const base = parseFloat(math.dataset.iiFont) || 100;   // MathJax's own size, in %
      math.style.fontSize = `${(base * scale).toFixed(1)}%`;
    }
  }

  function fit() {
    const article = document.querySelector("article.bd-article");
    if (!article) return;
    fitTables(article);
    fitMath(article);
  }

  let pending = 0;
  const later = () => { cancelAnimationFrame(pending); pending = requestAnimationFrame(fit); };
  document.addEventListener("DOMContentLoaded", fit);
  window.addEventListener("load", () => {   // after fonts, and MathJax, have set the widths
    later();
    const mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(later);
  });
  window.addEventListener("resize", later);
})();
