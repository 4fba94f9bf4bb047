// The website's code-exercise grader: each .code-exercise-browser (CodeExercise._checker_html in
// src/inference_course/code_exercises.py) gets an editor, a Check button and the verdict. The
// reader's code runs in Python in a Web Worker (code_exercises_worker.js, Pyodide), graded by the
// course's own grader against the cases and library outcomes in the element's data-export, so
// the verdicts and hints are Jupyter's. The page's exercises share one worker, started at the first
// Check. A case that runs past the export's time limit stops the worker (a fresh one starts at the
// next Check) and the verdict names that case.
// Loaded only on pages with such an exercise (book/_ext/course_site.py).
(function () {
  "use strict";

  const WORKER = new URL("code_exercises_worker.js", document.currentScript.src);

  // One Python for the page: the first Check starts it (a few seconds), every later Check, on any
  // exercise of the page, reuses it. Checks run one at a time, in the order pressed. A check that
  // runs past the time limit (or breaks Python) stops it; the next Check starts a fresh one.
  const python = { worker: null, queue: [], running: null };

  function startPython() {
    const worker = new Worker(WORKER, { type: "module" });
    // Messages of a Python that was stopped are not the running check's.
    worker.onmessage = (event) => {
      if (worker === python.worker && python.running) python.running.onMessage(event.data);
    };
    worker.onerror = (event) => {
      event.preventDefault();
      if (worker === python.worker && python.running) python.running.onError(event);
    };
    python.worker = worker;
  }

  function runNext() {
    if (python.running || python.queue.length === 0) return;
    const job = python.queue.shift();
    python.running = job;
    const fresh = python.worker === null;
    if (fresh) startPython();
    job.begin(fresh);
    python.worker.postMessage(job.message);
  }

  function done(job, stopPython) {
    if (stopPython && python.worker !== null) {
      python.worker.terminate();
      python.worker = null;
    }
    if (python.running === job) python.running = null;
    runNext();
  }

  function setUp(root) {
    const exp = JSON.parse(root.dataset.export);
    const exportJson = root.dataset.export;
    const editor = root.querySelector("textarea");
    const button = root.querySelector("button");
    const output = root.querySelector("output");

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

    button.addEventListener("click", () => {
      let timer = null;
      let current = null;   // the case running now, by index; null before the first
      const job = { message: { exportJson, runner: exp.runner, source: editor.value } };
      const stop = (message) => { clearTimeout(timer); show(false, message); done(job, true); };
      const arm = () => {
        clearTimeout(timer);
        timer = setTimeout(() => stop(current === null ? exp.no_case : exp.timeout
          .replace("{label}", () => exp.cases[current].label)
          .replace("{inputs}", () => exp.cases[current].shown)), exp.time_limit_s * 1000);
      };
      job.begin = (fresh) => {
        output.textContent = fresh ? "Loading Python (a few seconds), then running your code…" : "Running your code…";
      };
      job.onMessage = (msg) => {
        if (msg.type === "started") { current = null; arm(); }
        else if (msg.type === "case") { current = msg.index; arm(); }
        else if (msg.type === "verdict") { clearTimeout(timer); show(msg.correct, msg.message); done(job, false); }
        else if (msg.type === "failed") stop(`The grader failed in this browser: ${msg.message}`);
      };
      job.onError = (event) => stop(`Python could not start in this browser${event.message ? ": " + event.message : ""}. ` +
                                    "Open the chapter in Jupyter (make lab) to have your code graded.");
      button.disabled = true;
      root.dataset.state = "running";
      delete output.dataset.correct;
      python.queue.push(job);
      runNext();
      if (python.running !== job) output.textContent = "Waiting for another exercise's check to finish…";
    });
    root.hidden = false;
  }

  function init() {
    document.querySelectorAll(".code-exercise-browser[data-export]").forEach(setUp);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
