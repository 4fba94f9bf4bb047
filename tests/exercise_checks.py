"""The checks every chapter's exercise tests share (imported by tests/test_exercises_ch*.py)."""
import html


def assert_grades(exercise, right: str, wrong: list[str]) -> None:
    """The right answer passes; each wrong one fails with the hint in its message; the exercise has
    a prompt, hint and solution, and its static page shows them under its title."""
    assert exercise(right).correct
    for answer in wrong:
        verdict = exercise(answer)
        assert not verdict.correct, answer
        assert exercise.hint in verdict.message
    assert exercise.hint and exercise.solution and exercise.prompt
    page = exercise._static_html()
    assert "Hint" in page and "Solution" in page and html.escape(exercise.title) in page
