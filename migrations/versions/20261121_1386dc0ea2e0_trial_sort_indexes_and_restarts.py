"""Trial sort indexes; trial schedule summary and re-run count.

* One ``(study_id, <key>, number)`` index per sort key of ``StudyStore.list_trials`` (the
  number has the unique constraint), replacing ``(study_id, val_accuracy)``: a page of
  trials is read in index order instead of sorting the study's rows.
* ``stagetune_trials.schedule_summary``: the schedule in one line, written with the trial
  (NULL for rows written before: readers compute it then).
* ``stagetune_trials.restarts`` / ``restart_reason``: how many times the trial was started
  again (a resumed or taken-over study re-runs its unfinished trials) and why.

Revision ID: 1386dc0ea2e0
Revises: e0016842b873
Create Date: 2026-11-21 23:28:31.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = "1386dc0ea2e0"
down_revision: str | Sequence[str] | None = "e0016842b873"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copy of tuner.store.models.TRIAL_SORT_INDEXES at this revision.
SORT_KEYS = (
    "val_accuracy",
    "val_loss",
    "wall_time_s",
    "steps",
    "samples",
    "mean_batch_size",
    "epochs_done",
    "started_at",
    "finished_at",
)


def _index_name(key: str) -> str:
    return f"ix_stagetune_trials_study_id_{key}_number"


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("stagetune_trials") as batch:
        batch.add_column(sa.Column("schedule_summary", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column("restarts", sa.Integer(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("restart_reason", sa.Text(), nullable=True))
    op.drop_index("ix_stagetune_trials_study_id_val_accuracy", table_name="stagetune_trials")
    for key in SORT_KEYS:
        op.create_index(
            _index_name(key), "stagetune_trials", ["study_id", key, "number"], unique=False
        )


def downgrade() -> None:
    """Downgrade schema."""
    for key in reversed(SORT_KEYS):
        op.drop_index(_index_name(key), table_name="stagetune_trials")
    op.create_index(
        "ix_stagetune_trials_study_id_val_accuracy",
        "stagetune_trials",
        ["study_id", "val_accuracy"],
        unique=False,
    )
    with op.batch_alter_table("stagetune_trials") as batch:
        batch.drop_column("restart_reason")
        batch.drop_column("restarts")
        batch.drop_column("schedule_summary")
