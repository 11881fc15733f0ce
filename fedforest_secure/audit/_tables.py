"""SQLAlchemy tables of the audit log (private: use :class:`~.log.AuditLog`).

``audit_entries`` holds one row per entry, the canonical texts verbatim; ``UNIQUE(job_id, seq)``
makes two writers that race for the same ``seq`` fail instead of forking the chain.
``audit_arrays`` holds the ``.npy`` bytes of each entry's arrays, keyed by ``(job_id, seq, name)``.
``round_id`` is a query convenience copied from the payload (not hashed; verification checks it).
"""

from __future__ import annotations

from sqlalchemy import (
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

entries = Table(
    "audit_entries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(200), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("round_id", Integer, nullable=True),
    Column("timestamp", String(40), nullable=False),
    Column("payload", Text, nullable=False),
    Column("arrays", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    UniqueConstraint("job_id", "seq", name="uq_audit_entries_job_seq"),
    Index("ix_audit_entries_job_round", "job_id", "round_id"),
)

arrays = Table(
    "audit_arrays",
    metadata,
    Column("job_id", String(200), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", String(200), nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("job_id", "seq", "name", name="pk_audit_arrays"),
)
