"""The path and query parameters the routes and the pages both take, as ``Annotated`` aliases.

The patterns document the shapes in the OpenAPI schema; the ids are still parsed by the
store (InvalidSnapshotIdError, InvalidParamIdError: 400, naming what is wrong).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

SNAPSHOT_ID_PATTERN = r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$"
PARAM_ID_PATTERN = r"^[0-9a-f]{16}$"
#: the largest step a snapshot may have (an int64)
MAX_STEP = 2**63 - 1

SnapshotIdPath = Annotated[
    str,
    Path(
        description="a snapshot id: 26 uppercase Crockford base32 characters",
        json_schema_extra={"pattern": SNAPSHOT_ID_PATTERN},
    ),
]
ParamIdPath = Annotated[
    str,
    Path(
        description="a ParamId: 16 lowercase hex digits",
        json_schema_extra={"pattern": PARAM_ID_PATTERN},
    ),
]

RankQuery = Annotated[
    int | None,
    Query(
        ge=0,
        description="a sharded snapshot's rank (0..world_size-1): that rank's shard; "
        "refused for a snapshot written whole",
    ),
]

# the fields of an upload: the whole snapshot's and each rank's shard's
RunQuery = Annotated[str, Query(min_length=1, description="the run the snapshot belongs to")]
StepQuery = Annotated[int, Query(ge=0, le=MAX_STEP, description="the training step")]
TagsQuery = Annotated[str | None, Query(description='a JSON object of strings, e.g. {"lr": "0.1"}')]
