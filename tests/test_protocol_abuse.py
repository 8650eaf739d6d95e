"""Malformed JSON-RPC over stdio, against a real server subprocess: every line gets an answer (a JSON-RPC error with
the request's id where one can be read) and the server keeps serving the next request.

The SDK's own stdio transport drops these lines without a word (see servers/core/transport.py, StdinGuard).
"""

import json
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servers.core.transport import INVALID_REQUEST, PARSE_ERROR, check_line, scan_top_level
from tests.conftest import PYTHON, REPO_ROOT, server_env

pytestmark = pytest.mark.timeout(60)
ANSWER_TIMEOUT_S = 20.0


def call(request_id: Any, method: str, params: dict | None = None) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message)


def tool_call(request_id: Any, arguments_json: str) -> str:
    """A tools/call line whose arguments are given as raw JSON text (so that it can be invalid)."""
    head = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"method":"tools/call",'
    return head + f'"params":{{"name":"explain_xid","arguments":{arguments_json}}}}}'


DEEP = "[" * 100_000 + "]" * 100_000
DIGITS = "9" * 5000

# name: (line, [(id, code)] answers expected before the next request's answer)
MALFORMED: dict[str, tuple[str, list[tuple[Any, int]]]] = {
    "lone surrogate": (tool_call(7, '{"code":"\\ud800"}'), [(7, PARSE_ERROR)]),
    "lone low surrogate": (tool_call("s-1", '{"code":"x\\udfff"}'), [("s-1", PARSE_ERROR)]),
    "5000-digit integer argument": (tool_call(8, f'{{"code":{DIGITS}}}'), [(8, PARSE_ERROR)]),
    "5000-digit integer id": (f'{{"jsonrpc":"2.0","id":{DIGITS},"method":"ping"}}', [(None, PARSE_ERROR)]),
    "100k-deep nesting": (tool_call(9, f'{{"code":{DEEP}}}'), [(9, PARSE_ERROR)]),
    "100k-deep nesting before the id": (
        f'{{"jsonrpc":"2.0","params":{{"a":{DEEP}}},"id":"deep-first","method":"ping"}}',
        [("deep-first", PARSE_ERROR)],
    ),
    "batch": (f"[{call(10, 'tools/list')},{call(11, 'ping')}]", [(10, INVALID_REQUEST), (11, INVALID_REQUEST)]),
    "empty batch": ("[]", [(None, INVALID_REQUEST)]),
    "id null": (call(None, "tools/list"), [(None, INVALID_REQUEST)]),
    "id true": (call(True, "tools/list"), [(None, INVALID_REQUEST)]),
    "id fraction": (call(1.5, "tools/list"), [(None, INVALID_REQUEST)]),
    "method not a string": ('{"jsonrpc":"2.0","id":13,"method":5}', [(13, INVALID_REQUEST)]),
    "params a list": ('{"jsonrpc":"2.0","id":14,"method":"tools/list","params":[1]}', [(14, INVALID_REQUEST)]),
    "no jsonrpc version": ('{"id":15,"method":"ping"}', [(15, INVALID_REQUEST)]),
    "wrong jsonrpc version": ('{"jsonrpc":"1.0","id":16,"method":"ping"}', [(16, INVALID_REQUEST)]),
    "cut off": ('{"jsonrpc":"2.0","id":17,"method":"pi', [(17, PARSE_ERROR)]),
    "not json": ("hello there", [(None, PARSE_ERROR)]),
    "a number": ("42", [(None, INVALID_REQUEST)]),
    "a string": ('"ping"', [(None, INVALID_REQUEST)]),
}
# Lines that get no answer of their own (a malformed response must never be answered), yet must not stop the server.
UNANSWERED = {
    "blank line": "   ",
    "malformed response": '{"jsonrpc":"2.0","id":99,"result":5}',
    "response with a deep result": f'{{"jsonrpc":"2.0","id":98,"result":{DEEP}}}',
}


class RawStdio:
    """A server subprocess spoken to line by line, without an SDK client (which would refuse to send these)."""

    def __init__(self, home: Path) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "servers.cli", "serve", "diagnostics"],
            cwd=REPO_ROOT,
            env=server_env(home),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.counter = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, line: str | bytes) -> None:
        assert self.proc.stdin is not None
        data = line.encode() if isinstance(line, str) else line
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def until(self, request_id: Any) -> tuple[dict, list[dict]]:
        """Messages up to the answer to `request_id`: (that answer, the ones before it)."""
        before = []
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"no answer to {request_id!r} (server exit code {self.proc.poll()}); got {before}")
            try:
                message = json.loads(self.lines.get(timeout=left))
            except queue.Empty:
                continue
            if message.get("id") == request_id and ("result" in message or "error" in message):
                return message, before
            before.append(message)

    def ping(self) -> list[dict]:
        """A ping that must be answered; returns what came before its answer."""
        self.counter += 1
        request_id = f"ping-{self.counter}"
        self.send(call(request_id, "ping"))
        answer, before = self.until(request_id)
        assert answer.get("result") == {}, answer
        return before

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawStdio]:
    raw = RawStdio(tmp_path_factory.mktemp("abuse") / "state")
    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "abuse", "version": "0"}}
        raw.send(call("init", "initialize", init))
        answer, _ = raw.until("init")
        assert "result" in answer, answer
        raw.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        raw.ping()
        yield raw
    finally:
        raw.close()


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_line_is_answered_and_the_server_keeps_serving(server: RawStdio, name: str) -> None:
    line, expected = MALFORMED[name]
    server.send(line)
    before = server.ping()
    errors = [(m.get("id"), m["error"]["code"]) for m in before if "error" in m]
    assert errors == expected, (name, before)
    for message in before:
        assert message["jsonrpc"] == "2.0" and message["error"]["message"], message


@pytest.mark.parametrize("name", list(UNANSWERED))
def test_lines_without_an_answer_do_not_stop_the_server(server: RawStdio, name: str) -> None:
    server.send(UNANSWERED[name])
    assert server.ping() == []


def test_invalid_utf8_is_read_as_replacement_characters(server: RawStdio) -> None:
    # Raw bytes that are no UTF-8 (an encoded surrogate, a stray continuation byte) reach the tool as U+FFFD.
    server.send(tool_call(20, '{"code":"X"}').encode().replace(b"X", b"\xed\xa0\x80\x80"))
    answer, before = server.until(20)
    assert before == [] and answer["result"]["isError"] is True
    assert "code: got" in answer["result"]["content"][0]["text"]
    server.ping()


def test_a_good_tool_call_still_works_after_the_abuse(server: RawStdio) -> None:
    server.send(call(21, "tools/call", {"name": "explain_xid", "arguments": {"code": 79}}))
    answer, _ = server.until(21)
    assert answer["result"]["isError"] is False, answer
    assert answer["result"]["structuredContent"]


# ---- the same checks without a process ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MALFORMED))
def test_check_line_answers_what_the_sdk_would_drop(name: str) -> None:
    line, expected = MALFORMED[name]
    replies = check_line(line + "\n")
    assert replies is not None
    assert [(r.id, r.error.code) for r in replies] == expected


def test_check_line_passes_good_messages_and_drops_blank_lines_and_responses() -> None:
    for line in (
        call(1, "ping"),
        call("a", "tools/list", {}),
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
    ):
        assert check_line(line + "\n") is None
    for line in UNANSWERED.values():
        assert check_line(line + "\n") == []


def test_scan_top_level_reads_the_id_of_a_broken_message() -> None:
    assert scan_top_level('{"id": 5, "method": "x", "params": {"a": [[[') == ({"id", "method", "params"}, 5)
    assert scan_top_level('{"params": {"s": "}{\\"id\\": 3"}, "id": "real"}')[1] == "real"
    assert scan_top_level('{"id": true}')[1] is None
    assert scan_top_level('{"id": 1.5}')[1] is None
    assert scan_top_level("[1, 2]") == (set(), None)
    assert scan_top_level("") == (set(), None)
    assert scan_top_level('{"a": "unterminated') == ({"a"}, None)
