"""What a deleted study leaves behind, until a worker removes it.

* ``stagetune_study_leftovers``: one row per deleted study, written in the delete's
  transaction: its Ray Tune experiment directory name (``study-<id>-<token>``; the seed runs,
  reserves and stage-boundary states sit beside it under the same name) and its Optuna study
  names. A worker removes those and then the row; ``attempts`` / ``error`` say why a removal
  left something behind.

Revision ID: 5b8e4f0a2c71
Revises: 7c1e2d9a4b10
Create Date: 2026-11-30 18:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "5b8e4f0a2c71"
down_revision: str | Sequence[str] | None = "7c1e2d9a4b10"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "stagetune_study_leftovers"
INDEX = "ix_stagetune_study_leftovers_requested_at"


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("experiment", sa.String(length=200), nullable=False),
        sa.Column(
            "optuna_studies",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stagetune_study_leftovers")),
    )
    op.create_index(INDEX, TABLE, ["requested_at"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(INDEX, table_name=TABLE)
    op.drop_table(TABLE)
