"""Graders a reader's bug cannot freeze: a version of every code exercise that never returns is
stopped at the time limit, and the verdict names the case and the line it hung on; a version
that raises fails with the error named. Run with a short limit so the whole file takes seconds."""
import dataclasses
import faulthandler
import linecache
import signal
import time

import pytest

from inference_course.chapter_exercises import (ch01_code, ch02_code, ch03_code, ch04_code, ch05_code, ch06_code,
                                                   ch07_code)
from inference_course.code_exercises import TIME_LIMIT_S, call_with_limit

ALL = [ex for m in (ch01_code, ch02_code, ch03_code, ch04_code, ch05_code, ch06_code, ch07_code)
       for ex in m.CODE_EXERCISES]
LIMIT = 0.3
LOOP = "    n = 0\n    while True:\n        n += 1\n"
STUB_BODY = '    raise NotImplementedError("your code here")\n'


@pytest.fixture(autouse=True)
def no_hang():
    """Should the limit fail, the run dies with a traceback instead of hanging forever."""
    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def define(source: str, name: str, cell: str):
    """``name`` defined from ``source`` as a notebook cell defines it: its lines in linecache."""
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    namespace: dict = {}
    exec(compile(source, cell, "exec"), namespace)
    return namespace[name]


def with_body(ex, body: str, tag: str):
    assert ex.stub.count(STUB_BODY) == 1, ex.name
    return define(ex.stub.replace(STUB_BODY, body), ex.name, f"<{tag} {ex.name}>")


def graded(ex, fn):
    started = time.perf_counter()
    verdict = dataclasses.replace(ex, time_limit=LIMIT).grade(fn)
    return verdict, time.perf_counter() - started


def first_case(ex) -> str:
    return ex.cases()[0].label


def test_the_limit_is_stated_and_checked():
    assert all(ex.time_limit == TIME_LIMIT_S for ex in ALL)
    for bad in (0, -1, float("inf"), float("nan"), "10"):
        with pytest.raises(ValueError, match="time_limit"):
            dataclasses.replace(ALL[0], time_limit=bad)


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.name)
def test_a_loop_that_never_ends_is_stopped_and_named(ex):
    fn = with_body(ex, LOOP, "looping")
    loop_line = ex.stub.replace(STUB_BODY, LOOP).splitlines().index("    while True:") + 1
    before = signal.getsignal(signal.SIGALRM)
    verdict, seconds = graded(ex, fn)
    assert not verdict.correct
    # the first case hangs; the message names it, the limit, and the loop's line
    assert f"Case “{first_case(ex)}” did not finish within {LIMIT:g} s" in verdict.message, verdict.message
    assert (f"stopped in {ex.name}(), line {loop_line}: `while True:`" in verdict.message
            or f"stopped in {ex.name}(), line {loop_line + 1}: `n += 1`" in verdict.message), verdict.message
    assert "Inputs: " in verdict.message and "Hint: " in verdict.message
    assert LIMIT <= seconds < LIMIT + 5, seconds  # stopped at the limit, not hung (slack: a busy machine)
    assert signal.getsignal(signal.SIGALRM) is before  # the handler put back, nothing left armed
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.name)
def test_a_version_that_raises_fails_with_its_error(ex):
    fn = with_body(ex, '    raise RuntimeError("planted bug")\n', "raising")
    verdict, seconds = graded(ex, fn)
    assert not verdict.correct and seconds < LIMIT * 10
    assert "it raised RuntimeError: planted bug" in verdict.message, verdict.message
    label = next(c.label for c in ex.cases() if f"Case “{c.label}” failed" in verdict.message)
    assert label  # the verdict names one of the exercise's own cases


def test_a_loop_of_torch_ops_and_one_that_swallows_exceptions_are_stopped():
    ex = ch01_code.rms_norm_exercise
    torch_loop = with_body(ex, "    import torch\n    while True:\n        x = torch.ones(64) @ torch.ones(64)\n",
                           "torch-looping")
    verdict, seconds = graded(ex, torch_loop)
    assert "did not finish" in verdict.message and LIMIT <= seconds < LIMIT + 5
    careless = with_body(ex, "    while True:\n        try:\n            x = 1\n        except Exception:\n"
                             "            pass\n", "careless")
    verdict, _ = graded(ex, careless)
    assert "did not finish" in verdict.message


def test_a_planted_bpe_bug_that_loops_is_named():
    """merge_word with the step after a merge forgotten (i += 0): the reader's likely bug."""
    ex = ch02_code.bpe_exercise
    assert ex.solution.count("                i += 2\n") == 1
    fn = define(ex.solution.replace("                i += 2\n", "                i += 0\n"), ex.name, "<cell 7>")
    verdict, _ = graded(ex, fn)
    assert "did not finish" in verdict.message and "in merge_word(), line " in verdict.message, verdict.message


def test_the_correct_solution_still_passes_within_the_limit():
    for ex in ALL:
        assert dataclasses.replace(ex, time_limit=5.0).grade(ex.solution_function()).correct, ex.name


def test_an_outer_timer_keeps_its_deadline():
    """pytest-timeout and other code use SIGALRM too: their handler and remaining time come back."""
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.perf_counter()))
    try:
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        assert call_with_limit(lambda a, b: a + b, (2, 3), 0.1) == 5
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 1.0
        while not fired and time.perf_counter() - start < 5:
            time.sleep(0.01)
        assert fired and fired[0] - start >= 0.9  # the outer timer fired, on its own schedule
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
