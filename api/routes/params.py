"""Path and query parameters shared by the routers, with their bounds.

Ids and numbers are bounded to what the database columns hold, and text filters refuse NUL
characters, so a malformed request is a 422 rather than a database error.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import Path, Query

MAX_ID: Final = 2**31 - 1
MAX_PAGE: Final = 500
NO_NUL: Final = r"^[^\x00]*$"

StudyId = Annotated[int, Path(ge=1, le=MAX_ID, description="The study's id.")]
TrialNumber = Annotated[
    int, Path(ge=0, le=MAX_ID, description="The trial's number within its study.")
]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Page size.")]
Offset = Annotated[int, Query(ge=0, le=MAX_ID, description="Items to skip.")]
