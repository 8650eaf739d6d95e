"""Text from stored or untrusted data, made safe to show a person in a terminal.

A plan's command, its env values and a job's names come from the agent. Written raw to a terminal, an escape
sequence among them clears the screen, moves the cursor or sets a scroll region (a fake plan drawn above the real
prompt); a bidi override reorders what follows it; a zero-width or separator character hides text or breaks a
line where none shows. `visible` writes every such character as a backslash escape instead, and the backslash
itself as two, so what the person reads is the text exactly, one line, nothing hidden.
"""

from collections.abc import Iterable

# Escaped even where Python calls them printable (it does not for these today; the list keeps it so if a Unicode
# update changes its mind): bidi embeddings, overrides, isolates and marks, zero-width characters, separators.
_ALWAYS = frozenset(
    "\u061c\u180e\u200b\u200c\u200d\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069\ufeff"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: object) -> str:
    """`text` (str() of it) with every character a terminal would not show as itself written as an escape:
    C0 and C1 controls (ESC, CR, LF, NEL U+0085 ...), DEL, format characters (bidi overrides and isolates
    U+202A-202E and U+2066-2069, zero-width characters, U+FEFF), line and paragraph separators (U+2028, U+2029),
    surrogates, private-use and unassigned code points, and spaces other than U+0020. A backslash becomes two."""
    text = str(text)
    if text.isprintable() and "\\" not in text and not _ALWAYS.intersection(text):
        return text
    return "".join(_escape(ch) if ch == "\\" or ch in _ALWAYS or not ch.isprintable() else ch for ch in text)


def quoted(text: object) -> str:
    """`visible(text)` in double quotes, an inner double quote escaped: one argv element, its bounds shown."""
    return '"' + visible(text).replace('"', '\\"') + '"'


def quoted_list(items: Iterable[object]) -> str:
    """A list of quoted elements, `["a", "b c"]`: a command as its argv, each element's bounds shown."""
    return "[" + ", ".join(quoted(item) for item in items) + "]"
