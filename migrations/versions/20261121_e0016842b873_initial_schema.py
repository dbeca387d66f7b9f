"""Initial schema: stagetune_studies, stagetune_trials, stagetune_trial_metrics.

Generated with ``alembic revision --autogenerate`` against PostgreSQL, then reviewed:
constraint names come from the naming convention in tuner/store/models.py (identical on
SQLite and PostgreSQL), indexes are created with plain ``op.create_index``, and timestamps
are ``DateTime(timezone=True)`` (the models' UTCDateTime stores naive UTC on SQLite).

Revision ID: e0016842b873
Revises:
Create Date: 2026-11-21 20:25:19.338976
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "e0016842b873"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "stagetune_studies",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("task", sa.String(length=100), nullable=False),
        sa.Column(
            "spec",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("best_trial_id", sa.Integer(), nullable=True),
        sa.Column("best_value", sa.Double(), nullable=True),
        sa.Column(
            "summary",
            sa.JSON(none_as_null=True).with_variant(
                postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), "postgresql"
            ),
            nullable=True,
        ),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'completed', 'failed', 'cancelled')",
            name=op.f("ck_stagetune_studies_status"),
        ),
        sa.CheckConstraint("budget >= 1", name=op.f("ck_stagetune_studies_budget_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stagetune_studies")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_stagetune_studies_created_at", "stagetune_studies", ["created_at"], unique=False
    )
    op.create_index(
        "ix_stagetune_studies_owner_created_at",
        "stagetune_studies",
        ["owner", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_stagetune_studies_status_created_at",
        "stagetune_studies",
        ["status", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_stagetune_studies_task_created_at",
        "stagetune_studies",
        ["task", "created_at"],
        unique=False,
    )

    op.create_table(
        "stagetune_trials",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("baseline", sa.String(length=64), nullable=True),
        sa.Column(
            "schedule",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("epochs_done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("val_accuracy", sa.Double(), nullable=True),
        sa.Column("val_loss", sa.Double(), nullable=True),
        sa.Column("steps", sa.BigInteger(), nullable=True),
        sa.Column("samples", sa.BigInteger(), nullable=True),
        sa.Column("wall_time_s", sa.Double(), nullable=True),
        sa.Column("mean_batch_size", sa.Double(), nullable=True),
        sa.Column(
            "objective_values",
            sa.JSON(none_as_null=True).with_variant(
                postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), "postgresql"
            ),
            nullable=True,
        ),
        sa.CheckConstraint(
            "status IN ('running', 'completed', 'stopped', 'diverged', 'failed')",
            name=op.f("ck_stagetune_trials_status"),
        ),
        sa.CheckConstraint("number >= 0", name=op.f("ck_stagetune_trials_number_nonnegative")),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["stagetune_studies.id"],
            name=op.f("fk_stagetune_trials_study_id_stagetune_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stagetune_trials")),
        sa.UniqueConstraint("study_id", "number", name=op.f("uq_stagetune_trials_study_id_number")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_stagetune_trials_study_id_status",
        "stagetune_trials",
        ["study_id", "status"],
        unique=False,
    )
    op.create_index(
        "ix_stagetune_trials_study_id_val_accuracy",
        "stagetune_trials",
        ["study_id", "val_accuracy"],
        unique=False,
    )

    op.create_table(
        "stagetune_trial_metrics",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("val_accuracy", sa.Double(), nullable=True),
        sa.Column("val_loss", sa.Double(), nullable=True),
        sa.Column("train_loss", sa.Double(), nullable=True),
        sa.Column("epoch_time_s", sa.Double(), nullable=True),
        sa.Column("samples_per_s", sa.Double(), nullable=True),
        sa.Column("steps", sa.BigInteger(), nullable=True),
        sa.Column("samples", sa.BigInteger(), nullable=True),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("lr", sa.Double(), nullable=True),
        sa.Column("noise_scale", sa.Double(), nullable=True),
        sa.Column(
            "extra",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.CheckConstraint("epoch >= 0", name=op.f("ck_stagetune_trial_metrics_epoch_nonnegative")),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["stagetune_trials.id"],
            name=op.f("fk_stagetune_trial_metrics_trial_id_stagetune_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("trial_id", "epoch", name=op.f("pk_stagetune_trial_metrics")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("stagetune_trial_metrics")
    op.drop_index("ix_stagetune_trials_study_id_val_accuracy", table_name="stagetune_trials")
    op.drop_index("ix_stagetune_trials_study_id_status", table_name="stagetune_trials")

    op.drop_table("stagetune_trials")
    op.drop_index("ix_stagetune_studies_task_created_at", table_name="stagetune_studies")
    op.drop_index("ix_stagetune_studies_status_created_at", table_name="stagetune_studies")
    op.drop_index("ix_stagetune_studies_owner_created_at", table_name="stagetune_studies")
    op.drop_index("ix_stagetune_studies_created_at", table_name="stagetune_studies")

    op.drop_table("stagetune_studies")
