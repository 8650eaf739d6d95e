"""Block reading for the kernel-log scanner: a log given as a string, bytes, a reader (a file opened in binary or
text mode) or an iterable of lines is cut into blocks of whole lines, and only the lines holding a trigger word
are handed on, with their line numbers.

Speed and memory. The log is handled in blocks of whole lines (4 MiB of bytes when reading a file or a binary
reader, 16,384 lines joined when given an iterable of lines). In a block of bytes of at least VECTOR_BYTES, each
trigger word is found through its key, the byte or adjacent pair of bytes of the word that is rarest in the block's
first PROBE_BYTES: numpy compares the whole block against the key at once (in SIMD, at several GB/s), and only
where the key occurs are the word's other bytes checked, also vectorised. Newlines are counted the same way, for
``lines_read`` and each candidate's line number. A smaller block of bytes, and a block of text (a str log, an
iterable of lines), are searched with ``find`` of each whole word and ``count`` of newlines. Either way only the
lines that hold a trigger are cut out, decoded (UTF-8, undecodable bytes replaced) and handed on; an ordinary line
costs no Python bytecode and no allocation of its own. A line longer than MAX_LINE is cut there and the rest of it
skipped; a candidate line is handed on with at most MAX_PARSE characters. Memory: one block, a mask of a block's
size, and the carried start of an unfinished line (at most MAX_LINE).
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

MAX_PARSE = 4_096  # characters of a line given to the regular expressions (printk lines are <= 1024)
MAX_LINE = 1 << 20  # a "line" longer than this is cut; the rest up to its newline is skipped
CHUNK_BYTES = 4 << 20
BATCH_LINES = 16_384
VECTOR_BYTES = 1 << 16  # blocks of bytes at least this large are searched with numpy
PROBE_BYTES = 1 << 14  # where a trigger's rarest byte or pair is judged, at the start of each block
FEW_HITS = 256  # up to this many trigger words in a block, lines are numbered gap by gap; beyond, all at once
REKEY_BLOCKS = 8  # the keys are judged again every this many large blocks (a log's content changes as it goes)
KEY_PAIR_DENSITY = 4096  # a single byte is the key when it occurs less than once per this many bytes; else a pair

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
        self.vector_bytes = VECTOR_BYTES
        self.keys: list[tuple[int, int]] = []
        self.keys_age = 0
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
        elif isinstance(lines, bytes | bytearray):  # in CHUNK_BYTES pieces: the search's masks stay a block's size
            self.bytes_read = len(lines)
            view = memoryview(lines)
            for at in range(0, len(lines), CHUNK_BYTES):
                self.feed(bytes(view[at : at + CHUNK_BYTES]))
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
        if isinstance(text, bytes) and end - begin >= self.vector_bytes:
            self._block_bytes(text, begin, end)
            return
        self._block_find(text, begin, end)

    def _block_find(self, text: str | bytes, begin: int, end: int) -> None:
        """block() with str.find / bytes.find: text, and blocks of bytes too small for numpy to pay."""
        nl: Any = b"\n" if isinstance(text, bytes) else "\n"
        triggers: Sequence[Any] = self.triggers_bytes if isinstance(text, bytes) else self.triggers
        find = text.find
        rfind = text.rfind
        starts: set[int] = set()
        for word in triggers:
            pos = find(word, begin, end)
            while pos >= 0:
                starts.add((rfind(nl, begin, pos) + 1) or begin)
                pos = find(word, find(nl, pos, end) + 1, end)
        base = self.lines_read
        count = text.count
        on_line = self.on_line
        seen = 0
        prev = begin
        for start in sorted(starts):
            seen += count(nl, prev, start)
            prev = start
            line = text[start : min(find(nl, start, end), start + MAX_PARSE)]
            decoded = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
            on_line(decoded.rstrip("\r"), base + seen + 1)
        self.lines_read = base + count(nl, begin, end)

    def _block_bytes(self, text: bytes, begin: int, end: int) -> None:
        import numpy as np

        data = np.frombuffer(text, dtype=np.uint8, count=end - begin, offset=begin)
        if self.keys_age <= 0:  # judge the keys again every REKEY_BLOCKS large blocks, on this one's start
            sample = text[begin : begin + PROBE_BYTES]
            self.keys = [key_of(word, sample) for word in self.triggers_bytes]
            self.keys_age = REKEY_BLOCKS
        self.keys_age -= 1
        found = [_occurrences(data, word, key) for word, key in zip(self.triggers_bytes, self.keys, strict=True)]
        hits = np.concatenate(found) if found else np.empty(0, dtype=np.intp)
        newlines = data == 10
        base = self.lines_read
        on_line = self.on_line
        if 0 < len(hits) <= FEW_HITS:  # a few: each line's number from the newlines in the gap before it
            rfind = text.rfind
            find = text.find
            starts = sorted({(rfind(b"\n", begin, begin + at) + 1) or begin for at in hits.tolist()})
            seen = 0
            prev = begin
            for start in starts:  # the gaps together are one pass over the mask
                seen += int(np.count_nonzero(newlines[prev - begin : start - begin]))
                prev = start
                line = text[start : min(find(b"\n", start, end), start + MAX_PARSE)]
                on_line(line.decode("utf-8", "replace").rstrip("\r"), base + seen + 1)
        elif len(hits):  # many: every newline's place once, and each hit's line found by binary search
            ends = np.flatnonzero(newlines)
            lines = np.unique(np.searchsorted(ends, hits))  # the line's index in the block = newlines before it
            firsts = np.where(lines > 0, ends[np.maximum(lines - 1, 0)] + 1, 0)
            for index, first, stop in zip(lines.tolist(), firsts.tolist(), ends[lines].tolist(), strict=True):
                line = text[begin + first : begin + min(stop, first + MAX_PARSE)]
                on_line(line.decode("utf-8", "replace").rstrip("\r"), base + index + 1)
        self.lines_read = base + int(np.count_nonzero(newlines))

    def finish(self) -> None:
        """The end of the log: a last line without a newline is handed on too."""
        if self.carry:
            nl: Any = b"\n" if isinstance(self.carry[0], bytes) else "\n"
            tail = nl[:0].join(self.carry) + nl
            self.carry, self.carry_len = [], 0
            self.block(tail, 0, len(tail))


def key_of(word: bytes, sample: bytes) -> tuple[int, int]:
    """(offset, length 1 or 2) of the byte or adjacent pair of bytes of `word` that occurs least often in `sample`:
    a single byte when it is rare enough (less than once per KEY_PAIR_DENSITY bytes), else the rarest pair."""
    count = sample.count
    single = min(range(len(word)), key=lambda at: count(word[at : at + 1]))
    if len(word) < 2 or count(word[single : single + 1]) * KEY_PAIR_DENSITY < max(1, len(sample)):
        return single, 1
    return min(range(len(word) - 1), key=lambda at: count(word[at : at + 2])), 2


def _occurrences(data: Any, word: bytes, key: tuple[int, int]) -> Any:
    """Every position in `data` (a block of bytes as a uint8 array) where `word` starts, as an array.

    The key (offset, width: see key_of) is found by one vectorised comparison over the block, as a byte or, read as
    little-endian 16-bit words at both alignments, as a pair; each place it occurs is then checked for the rest of
    the word, vectorised too."""
    import numpy as np

    size = len(data)
    length = len(word)
    at, width = key
    if width == 1:
        keys = _where(data == word[at])
    else:
        code = word[at] | (word[at + 1] << 8)
        even = data[: size - size % 2].view("<u2")
        odd = data[1 : size - (size - 1) % 2].view("<u2")
        keys = np.concatenate((_where(even == code) * 2, _where(odd == code) * 2 + 1))
    starts = keys - at
    starts = starts[(starts >= 0) & (starts <= size - length)]
    pattern = np.frombuffer(word, dtype=np.uint8)
    for offset in range(length):  # each byte of the word outside the key narrows the candidates down
        if len(starts) == 0:
            break
        if not at <= offset < at + width:
            starts = starts[data[starts + offset] == pattern[offset]]
    return starts


def _where(mask: Any) -> Any:
    """np.flatnonzero(mask) of a boolean array, faster when few are set: the mask is read as 64-bit words first, and
    only the words that are not zero are looked into."""
    import numpy as np

    whole = len(mask) - len(mask) % 8
    words = mask[:whole].view(np.uint64)
    groups = np.flatnonzero(words != 0)
    if len(groups) * 8 > len(words):  # not sparse: the plain way is as fast
        return np.flatnonzero(mask)
    rows, cols = np.nonzero(mask[:whole].reshape(-1, 8)[groups])
    found = groups[rows] * 8 + cols
    if whole < len(mask):
        found = np.concatenate((found, np.flatnonzero(mask[whole:]) + whole))
    return found


def _guarded(lines: Iterable[Any], errors: list[BaseException]) -> Iterator[Any]:
    """The items of lines until it fails; the failure is kept, so the lines read before it are still scanned."""
    try:
        yield from lines
    except Exception as exc:
        errors.append(exc)
