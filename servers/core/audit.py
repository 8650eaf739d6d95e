"""The audit log: append-only JSON lines in the state directory, one per plan, submit, confirm, decline and
cancel, with who asked and when."""

import json
import time
from typing import Any

from servers.core.settings import Settings


class AuditLog:
    """Append-only JSON lines: every plan, submit, confirm, decline and cancel, with who asked."""

    def __init__(self, settings: Settings) -> None:
        self.path = settings.home / "audit.jsonl"

    def record(self, event: str, **fields: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"time": round(time.time(), 3), "event": event, **fields}, default=str) + "\n"
        with open(self.path, "a") as f:  # one write of one line in append mode
            f.write(line)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
