"""What a client keeps on its own disk: receipts of every upload (and local secrets, mode 0600)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedforest_secure.files import write_atomic

__all__ = ["ClientState"]


class ClientState:
    """A directory of append-only receipts, one JSON object per line."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def add_receipt(self, receipt: dict[str, Any]) -> None:
        with (self.root / "receipts.jsonl").open("a") as fh:
            fh.write(json.dumps(receipt, sort_keys=True) + "\n")

    def receipts(self) -> list[dict[str, Any]]:
        path = self.root / "receipts.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def write_secret(self, name: str, data: bytes) -> None:
        write_atomic(self.root / name, data, mode=0o600)

    def read_secret(self, name: str) -> bytes | None:
        path = self.root / name
        return path.read_bytes() if path.exists() else None
