// The website's exercise checker: the same checks as src/inference_course/exercises.py,
// read from the spec that Exercise.show() puts in each exercise's `data-check`, so a reader
// without a kernel gets the verdict and hint Jupyter gives. Every rule below mirrors a line of
// the Python (tests/test_exercise_js.py runs both over the same answers); change them together.
// Loaded only on pages with an exercise (book/_ext/course_site.py).
(function () {
  "use strict";

  // Python's whitespace: what str.strip() and str.split() remove (JavaScript's trim() differs).
  const WS = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005" +
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";
  const WS_CLASS = "[" + WS + "]";
  const STRIP = new RegExp("^" + WS_CLASS + "+|" + WS_CLASS + "+$", "g");
  const RUNS = new RegExp(WS_CLASS + "+");
  const UNIT = "[A-Za-z\u00b5\u03bc\u00d7/]+";
  const NUMBER = new RegExp("^([+-]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?)" +
    WS_CLASS + "*(%|" + UNIT + "(?:" + WS_CLASS + "+" + UNIT + ")?)?$");
  // exercises.SCALES and SCALE_WORDS: what a unit's first word multiplies its number by.
  const SCALES = new Map(Object.entries({"%": 0.01, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "bn": 1e9,
    "G": 1e9, "T": 1e12, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2 ** 10,
    "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40, "ms": 1e-3, "\u00b5s": 1e-6, "\u03bcs": 1e-6,
    "us": 1e-6, "ns": 1e-9}));
  const SCALE_WORDS = new Map(Object.entries({thousand: 1e3, million: 1e6, billion: 1e9, trillion: 1e12}));
  const DIGIT_SPACE = /(?<=[0-9]) (?=[0-9])/g;
  const WHOLE = /^[+-]?[0-9]+$/;
  const INT_ITEM = /^[+-]?[0-9]+(?:_[0-9]+)*$/;

  const strip = s => s.replace(STRIP, "");
  const split = s => strip(s).split(RUNS).filter(Boolean);
  const norm = s => split(s.toLowerCase()).join(" ");
  const noSpaces = s => split(s).join("").toLowerCase();

  // Python's repr() of a str, which the messages quote.
  function repr(s) {
    const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
    let out = quote;
    for (const ch of s) {
      const code = ch.codePointAt(0);
      if (ch === quote || ch === "\\") out += "\\" + ch;
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (ch === "\t") out += "\\t";
      else if (ch === " " || !/[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u.test(ch)) out += ch;
      else if (code < 0x100) out += "\\x" + code.toString(16).padStart(2, "0");
      else if (code < 0x10000) out += "\\u" + code.toString(16).padStart(4, "0");
      else out += "\\U" + code.toString(16).padStart(8, "0");
    }
    return out + quote;
  }

  class NotANumber extends Error {}
  class NotWhole extends Error {}

  function scaleOf(unit) {
    if (!unit) return 1.0;
    const word = split(unit)[0].split("/")[0];
    if (SCALES.has(word)) return SCALES.get(word);
    return SCALE_WORDS.get(word.toLowerCase()) ?? 1.0;
  }

  // exercises._read: [the number as typed, its unit's scale].
  function read(answer) {
    const text = strip(answer).replaceAll(",", "").replaceAll("_", "").replaceAll("\u2009", "");
    const match = NUMBER.exec(text.replace(DIGIT_SPACE, ""));
    if (match === null) throw new NotANumber();
    const x = Number(match[1]);
    const scale = scaleOf(match[2]);
    if (!Number.isFinite(x) || !Number.isFinite(x * scale)) throw new NotANumber();
    return [x, scale];
  }

  // exercises._readings and _nearest: the reading nearest the expected value, the first on a tie.
  function nearest(answer, expected, unit) {
    const [x, scale] = read(answer);
    const values = [x * scale, x];
    if (unit !== undefined && unit !== null) values.push(x * scale / scaleOf(unit));
    let best = values[0];
    for (const v of values.slice(1)) if (Math.abs(v - expected) < Math.abs(best - expected)) best = v;
    return best;
  }

  // math.isclose, as CPython computes it.
  function isclose(a, b, rel, abs) {
    if (a === b) return true;
    if (!Number.isFinite(a) || !Number.isFinite(b)) return false;
    const diff = Math.abs(b - a);
    return diff <= Math.abs(rel * b) || diff <= Math.abs(rel * a) || diff <= abs;
  }

  const verdict = (correct, message) => ({correct, message});
  const CORRECT = verdict(true, "Correct.");

  function checkNumber(spec, answer) {
    let x;
    // "12%" may mean 0.12 or 12, "12.3 GB" 12.3e9 or 12.3: judged on the reading nearer the expected value.
    try { x = nearest(answer, spec.expected, spec.unit); } catch (e) { return verdict(false, `${repr(answer)} is not a number.`); }
    if (isclose(x, spec.expected, spec.rel, spec.abs)) return CORRECT;
    return verdict(false, x > spec.expected ? "Too high." : "Too low.");
  }

  const bigint = digits => BigInt(digits.replace(/^\+/, "").replaceAll("_", ""));

  function asInt(answer, expected) {
    const digits = strip(answer).replace(/[,_ \u2009]/g, "");
    if (WHOLE.test(digits)) return bigint(digits);  // exact, even past 2**53
    const x = nearest(answer, Number(expected));
    if (!Number.isInteger(x)) throw new NotWhole();
    return BigInt(x);
  }

  function checkInteger(spec, answer) {
    let n;
    const expected = BigInt(spec.expected);
    try { n = asInt(answer, expected); } catch (e) {
      return verdict(false, e instanceof NotWhole ? "Expected a whole number." : `${repr(answer)} is not a number.`);
    }
    if (n === expected) return CORRECT;
    return verdict(false, n > expected ? "Too high." : "Too low.");
  }

  function checkChoice(spec, answer) {
    const key = spec.ignore_spaces ? noSpaces : norm;
    if (spec.options !== null && !spec.options.some(o => key(o) === key(answer)))
      return verdict(false, `Pick one of: ${spec.options.join(", ")}.`);
    return key(answer) === key(spec.expected) ? CORRECT : verdict(false, "Not quite.");
  }

  const ITEMS = {
    int: s => { if (!INT_ITEM.test(s)) throw new NotANumber(); return bigint(s); },
    str: s => s,
  };

  function checkSequence(spec, answer) {
    const parse = ITEMS[spec.items];
    const expected = spec.expected.map(parse);
    let items;
    try {
      let text = strip(answer);
      if (text.startsWith("[") || text.startsWith("(")) text = text.slice(1);
      if (text.endsWith("]") || text.endsWith(")")) text = text.slice(0, -1);
      items = text.split(",").filter(s => strip(s)).map(s => parse(strip(s)));
    } catch (e) {
      return verdict(false, `Could not read ${repr(answer)} as a comma-separated list.`);
    }
    if (items.length !== expected.length)
      return verdict(false, `Expected ${expected.length} items, got ${items.length}.`);
    const first = items.findIndex((x, i) => x !== expected[i]);
    return first < 0 ? CORRECT : verdict(false, `Not quite: item ${first + 1} differs.`);
  }

  function checkWordSet(spec, answer) {
    const want = new Set(spec.expected.map(w => w.toLowerCase()));
    const known = new Set(spec.words.map(w => w.toLowerCase()));
    const got = new Set(answer.replaceAll(";", ",").split(",").filter(w => strip(w)).map(w => strip(w).toLowerCase()));
    const inGot = [...got].filter(w => want.has(w)).length;
    if (inGot === got.size && got.size === want.size) return CORRECT;
    if ([...got].some(w => !known.has(w)))
      return verdict(false, `Use the candidate words: ${spec.words.join(", ")}.`);
    if (inGot === want.size) return verdict(false, spec.too_many);  // a proper superset
    if (inGot === got.size) return verdict(false, spec.too_few);    // a proper subset
    return verdict(false, "Not quite.");
  }

  const KINDS = {number: checkNumber, integer: checkInteger, choice: checkChoice,
                 sequence: checkSequence, word_set: checkWordSet};

  // Exercise.__call__: the check's verdict, with the hint after a wrong answer's message.
  function judge(exercise, answer) {
    const check = KINDS[exercise.check.kind];
    if (!check) throw new Error(`unknown check kind ${exercise.check.kind}`);
    const v = check(exercise.check, String(answer));
    return v.correct ? v : verdict(false, strip(`${v.message} Hint: ${exercise.hint}`));
  }

  // The answer box, as the Jupyter widget has it: Answer, Check, and a line of feedback.
  function mount(box) {
    const exercise = JSON.parse(box.dataset.check);
    const label = document.createElement("label");
    label.textContent = "Answer: ";
    const input = document.createElement("input");
    input.type = "text";
    input.placeholder = exercise.placeholder;
    input.autocomplete = "off";
    label.append(input);
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = "Check";
    const feedback = document.createElement("output");
    feedback.setAttribute("aria-live", "polite");
    const run = () => {
      if (!strip(input.value)) { feedback.textContent = ""; delete feedback.dataset.correct; return; }
      const v = judge(exercise, input.value);
      feedback.textContent = `${v.correct ? "\u2713" : "\u2717"} ${v.message}`;
      feedback.dataset.correct = v.correct;
    };
    button.addEventListener("click", run);
    input.addEventListener("keydown", e => { if (e.key === "Enter") run(); });
    box.replaceChildren(label, button, feedback);
  }

  const api = {judge, repr};
  if (typeof module !== "undefined") module.exports = api;  // node, for the tests
  if (typeof document !== "undefined") {
    window.exerciseChecker = api;
    const start = () => document.querySelectorAll(".exercise-answer[data-check]").forEach(mount);
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
    else start();
  }
})();
