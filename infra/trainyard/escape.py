"""Text shown to a person, with nothing hidden in it."""

from __future__ import annotations


def escaped(text: str) -> str:
    """`text` with every character but printable ASCII written as its escape (\\u0430, \\u200b, \\x00): a key
    with a Cyrillic look-alike or a zero-width character must look different from the key it imitates."""
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)
