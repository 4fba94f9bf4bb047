// On a narrow screen, a table wider than its column becomes one block per row, each cell under the
// name of its column (course.css, `table.ii-rows`), instead of a box the reader scrolls sideways with
// half the columns out of sight. Tables that fit keep their layout; widgets' tables are theirs.
(() => {
  const NARROW = window.matchMedia("(max-width: 720px)");

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

  function fit() {
    const article = document.querySelector("article.bd-article");
    if (!article) return;
    for (const table of article.querySelectorAll("table")) {
      if (table.closest(".ii-widget, .jupyter-widgets, .widget-subarea, .chapter-map")) continue;
      table.classList.remove("ii-rows");
      if (!NARROW.matches) continue;
      const box = table.parentElement;
      const column = Math.min(box.clientWidth || article.clientWidth, article.clientWidth);
      if (table.scrollWidth > column + 1 && label(table)) table.classList.add("ii-rows");
    }
  }

  let pending = 0;
  const later = () => { cancelAnimationFrame(pending); pending = requestAnimationFrame(fit); };
  document.addEventListener("DOMContentLoaded", fit);
  window.addEventListener("load", () => {   // after fonts, and MathJax, have set the tables' widths
    later();
    const mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(later);
  });
  window.addEventListener("resize", later);
})();
