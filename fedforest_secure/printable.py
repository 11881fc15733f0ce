"""Text from another party made safe to print: one line of plain text, whatever it holds.

What a server says reaches a site's operator (a job's failure reason, a site's name, an
error's ``detail``), and what a client sends reaches the server's log (a request's path, a
reason). Each character that is not printable (:meth:`str.isprintable`) is written as Python
writes it in a string: ``\\r``, ``\\n``, ``\\t``, ``\\x1b``, ``\\x07``, ``\\u2028``,
``\\U000e0001``. So a line break of any kind (CR, LF, NEL, U+2028) cannot forge a line, a
terminal escape sequence (a clipboard write, a hyperlink, a cursor movement, a window title)
reaches the terminal as its characters, not as a command, and NUL or a bidirectional override
cannot hide or reorder what follows.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

__all__ = ["escape_char", "normalisation_twin", "printable", "printable_lines"]

#: the escapes of characters that are not printable and have a short one
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape_char(c: str) -> str:
    """A character that is not printable as Python writes it in a string: ``\\r``,
    ``\\x1b``, ``\\u2028``."""
    o = ord(c)
    return _SHORT.get(c) or (f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000
                             else f"\\U{o:08x}")


def printable(text: str) -> str:
    """``text`` with each character that is not printable escaped (:func:`escape_char`);
    printable text as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else escape_char(c) for c in text)


def printable_lines(text: str) -> str:
    """``text`` whose own lines (``\\n``) stay lines, each :func:`printable`: for a message of
    several lines (an error listing problems) that may quote another party, whose text must
    then be :func:`printable` already so that its ``\\n`` cannot forge a line."""
    return "\n".join(printable(line) for line in text.split("\n"))


def normalisation_twin(text: str, others: Iterable[str]) -> str | None:
    """What to say when one of ``others`` is ``text`` in another Unicode normalisation (the
    same characters composed otherwise: ``é`` as one code point, or ``e`` and U+0301), which
    prints as the same text: that one and ``text`` written in ASCII escapes, and the
    normalisation to save it in; None when none is."""
    key = unicodedata.normalize("NFC", text)
    twin = next((o for o in others if o != text and unicodedata.normalize("NFC", o) == key),
                None)
    if twin is None:
        return None
    form = next((f for f in ("NFC", "NFD") if unicodedata.is_normalized(f, text)), None)
    save = f"save the table's text in {form}" if form else "write it as the schema does"
    return (f"the table's {twin!r} differs from the schema's {text!r} in Unicode normalisation "
            f"only ({ascii(twin)} against {ascii(text)}): {save}")
