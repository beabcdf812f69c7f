"""Initial schema: jobs, function versions, packages.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

JSON_TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("function", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("caller", sa.String(255), nullable=False),
        sa.Column("sku", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("lease_tag", sa.String(255), nullable=True),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("timeout_s", sa.Double, nullable=True),
        sa.Column("max_retries", sa.Integer, nullable=False),
        sa.Column("pods_needed", sa.Integer, nullable=False),
        sa.Column("input", JSON_TEXT, nullable=False),
        sa.Column("output", JSON_TEXT, nullable=True),
        sa.Column("error", JSON_TEXT, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("retries", sa.Integer, nullable=False),
        sa.Column("attempts", JSON_TEXT, nullable=False),
        sa.Column("acquisition", JSON_TEXT, nullable=True),
        sa.Column("submitted", sa.Double, nullable=False),
        sa.Column("started", sa.Double, nullable=True),
        sa.Column("first_instruction", sa.Double, nullable=True),
        sa.Column("finished", sa.Double, nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("request_hash", sa.String(128), nullable=True),
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_jobs_state_submitted", "jobs", ["state", "submitted"])
    op.create_index("ix_jobs_caller_submitted", "jobs", ["caller", "submitted"])
    op.create_index("ix_jobs_submitted", "jobs", ["submitted"])
    op.create_index(
        "uq_jobs_caller_idempotency", "jobs", ["caller", "idempotency_key"], unique=True
    )
    op.create_table(
        "functions",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("sku", sa.String(64), nullable=False),
        sa.Column("package_digest", sa.String(64), nullable=False),
        sa.Column("entrypoint", sa.String(255), nullable=True),
        sa.Column("command", JSON_TEXT, nullable=True),
        sa.Column("requirements_digest", sa.String(64), nullable=True),
        sa.Column("env", JSON_TEXT, nullable=False),
        sa.Column("timeout_s", sa.Double, nullable=False),
        sa.Column("max_retries", sa.Integer, nullable=False),
        sa.Column("pods", sa.Integer, nullable=False),
        sa.Column("single_use", sa.Boolean, nullable=False),
        sa.Column("created", sa.Double, nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        mysql_charset="utf8mb4",
    )
    op.create_table(
        "packages",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("created", sa.Double, nullable=False),
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("packages")
    op.drop_table("functions")
    op.drop_table("jobs")
