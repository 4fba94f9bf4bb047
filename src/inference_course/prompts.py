"""The course's fixed texts: prompts the chapters and benchmarks run, and a text to score quality on."""
from __future__ import annotations

# Input-grounded prompts: the answer copies spans of the prompt (where prompt lookup shines).
GROUNDED = [
    "Add a docstring to this function and return the whole function:\n\ndef total_price(items, tax_rate):\n"
    "    subtotal = sum(item.price * item.quantity for item in items)\n    tax = subtotal * tax_rate\n"
    "    return subtotal + tax\n",
    "Translate this Python function to use a for loop instead of sum, keeping the names:\n\n"
    "def total_price(items, tax_rate):\n    subtotal = sum(item.price * item.quantity for item in items)\n"
    "    return subtotal * (1 + tax_rate)\n",
    "Here is a paragraph:\n\"The Eiffel Tower was completed in 1889 for the World's Fair in Paris. It is 330 "
    "metres tall and was the tallest man-made structure in the world for 41 years.\"\n"
    "Quote the first sentence of the paragraph.",
    "Rewrite the following text in the same words but as a bulleted list:\nThe museum opens at nine in the "
    "morning, closes at six in the evening, is free on Sundays, and offers guided tours every hour.",
]
OPEN_ENDED = ["Write a short story about a robot who learns to paint.",
              "What are three tips for staying productive when working from home?",
              "Explain why the sky is blue."]


def zen_of_python() -> str:
    """A fixed English text that ships with every Python: ``import this``'s Zen, decoded from the
    ROT13 it is stored in (read from the module's file: importing it would print it)."""
    import codecs
    import importlib.util

    source = open(importlib.util.find_spec("this").origin, encoding="utf-8").read()
    return codecs.decode(source.split('"""')[1], "rot13")
