"""A careful forger of an audit log: rewrite one entry and recompute every later hash."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from fedforest_secure.audit import AuditLog, Entry
from fedforest_secure.audit.entry import GENESIS, encode_array


def forge(log: AuditLog, job_id: str, seq: int, *, aggregate: np.ndarray | None = None,
          payload: dict[str, object] | None = None) -> None:
    """Change entry ``seq`` of ``job_id`` (its payload fields, its aggregate array) and
    recompute the hash chain from there on, as someone with write access to the database would."""
    entries = log.entries(job_id=job_id)
    prev = entries[seq - 2].hash if seq > 1 else GENESIS
    with log.engine.begin() as conn:
        for e in entries[seq - 1:]:
            arrays, body = e.arrays, e.payload
            if e.seq == seq:
                body = {**body, **(payload or {})}
                if aggregate is not None:
                    info, blob = encode_array("aggregate", aggregate)
                    arrays = {**arrays, "aggregate": info}
                    conn.execute(text("UPDATE audit_arrays SET data = :d WHERE job_id = :j AND "
                                      "seq = :s AND name = 'aggregate'"),
                                 {"d": blob, "j": job_id, "s": seq})
            new = Entry.build(job_id=e.job_id, seq=e.seq, kind=e.kind, timestamp=e.timestamp,
                              payload=body, arrays=arrays, prev_hash=prev)
            conn.execute(text("UPDATE audit_entries SET payload = :pl, arrays = :a, "
                              "prev_hash = :p, hash = :h WHERE job_id = :j AND seq = :s"),
                         {"pl": new.payload_json, "a": new.arrays_json, "p": new.prev_hash,
                          "h": new.hash, "j": job_id, "s": e.seq})
            prev = new.hash
