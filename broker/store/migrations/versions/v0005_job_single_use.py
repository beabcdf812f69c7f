"""A call may ask for a fresh pod for itself: ``jobs.single_use``.

A job runs on a pod made for it and retired after it when its call asked (``single_use`` in
the invoke body) or its function version does; existing jobs asked nothing.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("single_use", sa.Boolean, nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    op.drop_column("jobs", "single_use")
