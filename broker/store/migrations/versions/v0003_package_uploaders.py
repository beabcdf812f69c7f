"""Package uploaders: a package's bytes are usable only by the callers who uploaded them.

Without this table any deployer could register a function on any stored digest (another
caller's code, never uploaded by them) and learn by ``HEAD`` that a digest was stored.
Existing functions' owners are recorded as uploaders of their packages and requirements files,
so nobody loses a package they registered before.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "package_uploaders",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("caller", sa.String(255), primary_key=True),
        sa.Column("created", sa.Double, nullable=False),
        mysql_charset="utf8mb4",
    )
    for column in ("package_digest", "requirements_digest"):
        op.execute(
            f"INSERT INTO package_uploaders (digest, caller, created) "
            f"SELECT DISTINCT {column}, owner, 0 FROM functions "
            f"WHERE {column} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM package_uploaders u "
            f"WHERE u.digest = functions.{column} AND u.caller = functions.owner)"
        )


def downgrade() -> None:
    op.drop_table("package_uploaders")
