"""Trial metric value: the final value of the study's metric, whatever it is.

* ``stagetune_trials.metric_value``: the final value of ``objective.metric`` (val_accuracy,
  val_loss, val_psnr, ...), written when the trial finishes; NULL for rows written before
  (readers use ``val_accuracy`` then: every study before this revision optimised it).
* its ``(study_id, metric_value, number)`` sort index, like the other sort keys.

Revision ID: 7c1e2d9a4b10
Revises: 1386dc0ea2e0
Create Date: 2026-11-25 18:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = "7c1e2d9a4b10"
down_revision: str | Sequence[str] | None = "1386dc0ea2e0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_stagetune_trials_study_id_metric_value_number"


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("stagetune_trials") as batch:
        batch.add_column(sa.Column("metric_value", sa.Double(), nullable=True))
    op.create_index(
        INDEX, "stagetune_trials", ["study_id", "metric_value", "number"], unique=False
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(INDEX, table_name="stagetune_trials")
    with op.batch_alter_table("stagetune_trials") as batch:
        batch.drop_column("metric_value")
