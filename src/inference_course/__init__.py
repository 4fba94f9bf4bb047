"""The course around the engine: what the book needs and the engine does not.

It imports ``inference_internals`` (the engine); the engine never imports it
(tests/test_layers.py fails if it does).

exercises          numeric and multiple-choice exercises: one spec, checked in Python and on the site
code_exercises     graded code exercises: the reader's function against the library's, case by case
chapter_exercises  each chapter's exercises (chNN) and code exercises (chNN_code)
static_widgets     widgets that work on the static site (precomputed frames, JS calculators) and in Jupyter
plotting           one figure style for the book, and a check that text stays legible on a phone
diagrams           the six diagrams of the book's map (the home page), one per chapter
chapter_maps       each chapter's diagram at its top, and the strip under each section saying where it sits
listing            source listings of the engine for the chapters, long ones folded
prompts            the fixed texts the chapters and benchmarks run
gpu_report         chapter 3's three regimes of a decode step, drawn from a gpu-check run
train_mtp          trains chapter 6's MTP heads on the model's own generations
hf_batching        transformers' generate_batch against the paged engine: chapter 5's reference
"""
