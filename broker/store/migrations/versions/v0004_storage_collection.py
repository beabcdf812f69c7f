"""Storage collection and quotas: when a package was last uploaded and its last function
deleted, uploads a caller was authorised to make and has not finished, uploaders by caller.

A package no function version references is deleted once the grace period has passed since
the latest of those times (``broker.storage_collection``); a caller's stored bytes are summed
over its uploader rows (``broker.quotas``). Functions deleted before this revision are stamped
with the upgrade's time, and packages' last upload is their first: the grace period of both
starts no earlier than the upgrade.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("functions", sa.Column("deleted_at", sa.Double, nullable=True))
    op.execute(
        sa.text("UPDATE functions SET deleted_at = :now WHERE deleted = :yes").bindparams(
            now=time.time(), yes=True
        )
    )
    op.create_index("ix_functions_package_digest", "functions", ["package_digest"])
    op.create_index("ix_functions_requirements_digest", "functions", ["requirements_digest"])
    op.add_column(
        "packages",
        sa.Column("last_uploaded", sa.Double, nullable=False, server_default=sa.text("0")),
    )
    op.execute("UPDATE packages SET last_uploaded = created")
    op.create_index("ix_package_uploaders_caller", "package_uploaders", ["caller"])
    op.create_table(
        "package_holds",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("caller", sa.String(255), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("expires", sa.Double, nullable=False),
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("package_holds")
    op.drop_index("ix_package_uploaders_caller", table_name="package_uploaders")
    op.drop_column("packages", "last_uploaded")
    op.drop_index("ix_functions_requirements_digest", table_name="functions")
    op.drop_index("ix_functions_package_digest", table_name="functions")
    op.drop_column("functions", "deleted_at")
