"""Result retention: a job's output can expire; find unexpired finished jobs by finish time.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("output_expired", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_jobs_expiry", "jobs", ["output_expired", "finished"])


def downgrade() -> None:
    op.drop_index("ix_jobs_expiry", table_name="jobs")
    op.drop_column("jobs", "output_expired")
