"""What the coordinator's side and the clients' side speak: messages, encodings, API shapes.

* :mod:`.wire` -- the binary encoding (:func:`pack` / :func:`unpack`) and the typed
  statistics blocks of a summable vector (:class:`Block`, :class:`StatKind`);
* :mod:`.tasks` -- one round's :class:`Task` and each client's :class:`Reply`
  (:class:`SealedTask`: a task whose bytes and digests are computed once);
* :mod:`.uploads` -- a client's upload body for a round and the checks it must pass
  (:mod:`.bounds`: the public range of each plaintext entry, from the round's codec);
* :mod:`.questions` -- the identity of the question a secure sum answers;
* :mod:`.api` -- the JSON request and response models of the HTTPS API.

This package holds no network code.
"""

from __future__ import annotations

from .questions import question_key
from .tasks import (
    TASK_ARRAY_DTYPES,
    TASK_ARRAYS,
    TASK_PARAMS,
    Reply,
    SealedTask,
    Task,
    TaskKind,
    check_task_form,
    seal,
)
from .uploads import (
    SUMMABLE,
    ParsedUpload,
    allowed_disclosures,
    check_against_task,
    check_disclosures,
    make_upload,
    parse_upload,
    upload_size_bound,
)
from .wire import (
    Block,
    StatKind,
    kind_code,
    kinds_vector,
    layout_size,
    pack,
    split_blocks,
    unpack,
)

__all__ = [
    "SUMMABLE",
    "TASK_ARRAYS",
    "TASK_ARRAY_DTYPES",
    "TASK_PARAMS",
    "Block",
    "ParsedUpload",
    "Reply",
    "SealedTask",
    "StatKind",
    "Task",
    "TaskKind",
    "allowed_disclosures",
    "check_against_task",
    "check_disclosures",
    "check_task_form",
    "kind_code",
    "kinds_vector",
    "layout_size",
    "make_upload",
    "pack",
    "parse_upload",
    "question_key",
    "seal",
    "split_blocks",
    "unpack",
    "upload_size_bound",
]
