// The website's code-exercise grader: each .code-exercise-browser (CodeExercise._checker_html in
// src/inference_course/code_exercises.py) gets an editor, a Check button and the verdict. The
// reader's code runs in Python in a Web Worker (code_exercises_worker.js, Pyodide), graded by the
// course's own grader against the cases and library outcomes in the element's data-export, so
// the verdicts and hints are Jupyter's. A case that runs past the export's time limit stops the
// worker (a fresh one starts at the next Check) and the verdict names that case.
// Loaded only on pages with such an exercise (book/_ext/course_site.py).
(function () {
  "use strict";

  const WORKER = new URL("code_exercises_worker.js", document.currentScript.src);

  function setUp(root) {
    const exp = JSON.parse(root.dataset.export);
    const exportJson = root.dataset.export;
    const editor = root.querySelector("textarea");
    const button = root.querySelector("button");
    const output = root.querySelector("output");
    let worker = null;
    let timer = null;
    let current = null;   // the case running now, by index; null before the first

    // As tall as its code (a solution is longer than the stub): the box does not scroll inside the page.
    const fit = () => { editor.rows = Math.max(4, editor.value.split("\n").length + 1); };
    fit();
    editor.addEventListener("input", fit);
    editor.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey || event.shiftKey)) {
        event.preventDefault();   // Jupyter's keys for running a cell
        if (!button.disabled) button.click();
        return;
      }
      if (event.key !== "Tab" || event.shiftKey || event.ctrlKey || event.altKey || event.metaKey) return;
      event.preventDefault();   // indent, as an editor does, instead of leaving the box
      editor.setRangeText("    ", editor.selectionStart, editor.selectionEnd, "end");
      fit();
    });

    function show(correct, message) {
      output.dataset.correct = String(correct);
      output.textContent = message;
      button.disabled = false;
      root.dataset.state = "done";
    }

    function stop(message) {
      clearTimeout(timer);
      if (worker !== null) worker.terminate();
      worker = null;
      show(false, message);
    }

    function arm() {
      clearTimeout(timer);
      timer = setTimeout(() => stop(current === null ? exp.no_case : exp.timeout
        .replace("{label}", () => exp.cases[current].label)
        .replace("{inputs}", () => exp.cases[current].shown)), exp.time_limit_s * 1000);
    }

    function start() {
      worker = new Worker(WORKER, { type: "module" });
      worker.onmessage = (event) => {
        const msg = event.data;
        if (msg.type === "started") { current = null; arm(); }
        else if (msg.type === "case") { current = msg.index; arm(); }
        else if (msg.type === "verdict") { clearTimeout(timer); show(msg.correct, msg.message); }
        else if (msg.type === "failed") stop(`The grader failed in this browser: ${msg.message}`);
      };
      worker.onerror = (event) => {
        event.preventDefault();
        stop(`Python could not start in this browser${event.message ? ": " + event.message : ""}. ` +
             "Open the chapter in Jupyter (make lab) to have your code graded.");
      };
    }

    button.addEventListener("click", () => {
      const fresh = worker === null;
      if (fresh) start();
      button.disabled = true;
      root.dataset.state = "running";
      delete output.dataset.correct;
      output.textContent = fresh ? "Loading Python (a few seconds), then running your code…" : "Running your code…";
      worker.postMessage({ exportJson, runner: exp.runner, source: editor.value });
    });
    root.hidden = false;
  }

  function init() {
    document.querySelectorAll(".code-exercise-browser[data-export]").forEach(setUp);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
