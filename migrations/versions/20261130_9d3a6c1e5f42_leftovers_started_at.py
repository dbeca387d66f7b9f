"""When a deleted study had first run, kept with what it left behind.

* ``stagetune_study_leftovers.started_at``: the study's ``started_at`` at its delete (NULL: it
  never ran, or it was deleted before this column). A worker that finds no files of a study
  that ran on its own storage path keeps the record a while, for the worker whose path holds
  them, instead of forgetting it at once.

Revision ID: 9d3a6c1e5f42
Revises: 5b8e4f0a2c71
Create Date: 2026-11-30 21:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = "9d3a6c1e5f42"
down_revision: str | Sequence[str] | None = "5b8e4f0a2c71"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "stagetune_study_leftovers"


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column(TABLE, sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("started_at")
