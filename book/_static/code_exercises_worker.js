// Runs a reader's code exercise in Python (Pyodide), off the page's thread: a loop that never ends
// blocks this worker, never the page, and code_exercises.js stops it after the time limit.
// Pyodide and its standard library come from the site itself (scripts/offline_assets.py copies
// them from node_modules into _static/pyodide/); it loads none of its packages.
// A module worker: started with new Worker(url, {type: "module"}).
import { loadPyodide } from "./pyodide/pyodide.mjs";

let pyodide = null;
let grade = null;   // browser_grading.grade, defined from the first export's runner

self.onmessage = async (event) => {
  const { exportJson, runner, source } = event.data;
  try {
    if (pyodide === null) {
      pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
    }
    if (grade === null) {
      const namespace = pyodide.globals.get("dict")();
      pyodide.runPython(runner, { globals: namespace });
      grade = namespace.get("grade");
    }
    self.postMessage({ type: "started" });
    const result = grade(exportJson, source, (i) => self.postMessage({ type: "case", index: i }));
    self.postMessage({ type: "verdict", ...JSON.parse(result) });
  } catch (err) {
    self.postMessage({ type: "failed", message: String(err && err.message || err) });
  }
};
