"""Block reading for the kernel-log scanner: a log given as a string, bytes, a reader (a file opened in binary or
text mode) or an iterable of lines is cut into blocks of whole lines, and only the lines holding a trigger word
are handed on, with their line numbers.

Speed and memory. The log is handled in blocks of whole lines (4 MiB of bytes when reading a file or a binary
reader, 16,384 lines joined when given an iterable of lines): one ``find`` pass per trigger word over the block,
each running in C at over 1 GB/s, plus one ``count`` of newlines for line numbers; only the lines that hold a trigger
are cut out, decoded (UTF-8, undecodable bytes replaced) and handed on. An ordinary line costs no Python bytecode
and no allocation of its own. A line longer than MAX_LINE is cut there and the rest of it skipped; a candidate line
is handed on with at most MAX_PARSE characters.
"""

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

MAX_PARSE = 4_096  # characters of a line given to the regular expressions (printk lines are <= 1024)
MAX_LINE = 1 << 20  # a "line" longer than this is cut; the rest up to its newline is skipped
CHUNK_BYTES = 4 << 20
BATCH_LINES = 16_384

LineHandler = Callable[[str, int], None]


def as_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item).decode("utf-8", "replace")
    return str(item)


class BlockReader:
    """Feeds `on_line(line, number)` (1-based) with every line that holds one of `triggers`, in log order.

    Counts every line (``lines_read``) and, for bytes and binary readers, every byte (``bytes_read``; None for
    text). ``read`` takes the whole log; ``feed`` any piece of it; ``finish`` hands on a last line without a
    newline."""

    def __init__(self, on_line: LineHandler, triggers: tuple[str, ...]) -> None:
        self.on_line = on_line
        self.triggers = triggers
        self.triggers_bytes = tuple(word.encode() for word in triggers)
        self.lines_read = 0
        self.bytes_read: int | None = None
        self.carry: list[Any] = []  # pieces of a line not yet ended (str or bytes, never both)
        self.carry_len = 0
        self.skipping = False

    def read(self, lines: Iterable[Any]) -> None:
        """The whole log: a str, bytes, a reader (anything with .read) or an iterable of lines. Raises what the
        reader or iterable raises, after handing on every line read before it."""
        if isinstance(lines, str):
            self.feed(lines)
        elif isinstance(lines, bytes | bytearray):
            self.bytes_read = len(lines)
            self.feed(bytes(lines))
        elif callable(getattr(lines, "read", None)):
            self._read_reader(lines.read)  # type: ignore[attr-defined]
        else:
            self._read_lines(lines)

    def _read_reader(self, read: Callable[[int], Any]) -> None:
        chunk = read(CHUNK_BYTES)
        if isinstance(chunk, bytes | bytearray | memoryview):  # binary: scanned as bytes, only matched lines decoded
            self.bytes_read = 0
            while chunk:
                chunk = bytes(chunk)
                self.bytes_read += len(chunk)
                self.feed(chunk)
                chunk = read(CHUNK_BYTES)
            return
        while chunk:
            self.feed(as_text(chunk))
            chunk = read(CHUNK_BYTES)

    def _read_lines(self, lines: Iterable[Any]) -> None:
        errors: list[BaseException] = []
        iterator: Iterator[Any] = _guarded(lines, errors)
        while True:
            batch = list(islice(iterator, BATCH_LINES))
            if not batch:
                break
            try:
                joined = "".join(batch)
            except TypeError:
                batch = [as_text(item) for item in batch]
                joined = "".join(batch)
            if "\n" not in joined:  # lines without terminators (str.splitlines(), most generators): one per item
                text = "\n".join(batch)
            else:  # terminated lines (a file's iterator) or a mix: an item ends a line, and so does each newline in it
                text = "\n".join([item[:-1] if item.endswith("\n") else item for item in batch])
            self.feed(text + "\n")
        if errors:
            raise errors[0]

    def feed(self, piece: str | bytes) -> None:
        """Any piece of the log, text or UTF-8 bytes (one kind per scan); a line may span pieces."""
        nl: Any = b"\n" if isinstance(piece, bytes) else "\n"
        begin = 0
        if self.skipping:  # the rest of a line that was cut at MAX_LINE
            cut = piece.find(nl)
            if cut < 0:
                return
            begin = cut + 1
            self.skipping = False
        if self.carry:  # the start of a line left by the previous piece
            cut = piece.find(nl, begin)
            if cut < 0:
                self._carry(piece[begin:])
                return
            self.carry.append(piece[begin : cut + 1])
            head = nl[:0].join(self.carry)
            self.carry, self.carry_len = [], 0
            self.block(head, 0, len(head))
            begin = cut + 1
        end = piece.rfind(nl, begin) + 1
        if end > begin:
            self.block(piece, begin, end)
        else:
            end = begin
        if end < len(piece):
            self._carry(piece[end:])

    def _carry(self, part: str | bytes) -> None:
        self.carry.append(part)
        self.carry_len += len(part)
        if self.carry_len > MAX_LINE:  # no newline for too long: scan the start as one line, skip the rest
            nl: Any = b"\n" if isinstance(part, bytes) else "\n"
            head = nl[:0].join(self.carry)[:MAX_LINE] + nl
            self.carry, self.carry_len = [], 0
            self.block(head, 0, len(head))
            self.skipping = True

    def block(self, text: str | bytes, begin: int, end: int) -> None:
        """text[begin:end] is whole lines, each ending in a newline. Only lines holding a trigger are looked at."""
        raw = isinstance(text, bytes)
        nl: Any = b"\n" if raw else "\n"
        find = text.find
        rfind = text.rfind
        starts: set[int] = set()
        for word in self.triggers_bytes if raw else self.triggers:
            pos = find(word, begin, end)  # type: ignore[arg-type]
            while pos >= 0:
                starts.add((rfind(nl, begin, pos) + 1) or begin)
                pos = find(word, find(nl, pos, end) + 1, end)  # type: ignore[arg-type]
        base = self.lines_read
        count = text.count
        on_line = self.on_line
        if starts:
            seen = 0
            prev = begin
            for start in sorted(starts):
                seen += count(nl, prev, start)
                prev = start
                stop = find(nl, start, end)
                line: Any = text[start : min(stop, start + MAX_PARSE)]
                if raw:
                    line = line.decode("utf-8", "replace")
                on_line(line.rstrip("\r"), base + seen + 1)
        self.lines_read = base + count(nl, begin, end)

    def finish(self) -> None:
        """The end of the log: a last line without a newline is handed on too."""
        if self.carry:
            nl: Any = b"\n" if isinstance(self.carry[0], bytes) else "\n"
            tail = nl[:0].join(self.carry) + nl
            self.carry, self.carry_len = [], 0
            self.block(tail, 0, len(tail))


def _guarded(lines: Iterable[Any], errors: list[BaseException]) -> Iterator[Any]:
    """The items of lines until it fails; the failure is kept, so the lines read before it are still scanned."""
    try:
        yield from lines
    except Exception as exc:
        errors.append(exc)
