"""secret rotation without an outage: the previous secrets of provider accounts, each valid until the end of
its overlap, with the requests signed with it counted

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import procurd.db.types

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UTC_DATETIME = procurd.db.types.UtcDateTime(timezone=True)
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "provider_old_secrets",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.BigInteger(), nullable=False),
        sa.Column("api_secret", sa.String(length=128), nullable=False),
        sa.Column("replaced_at", UTC_DATETIME, nullable=False),
        sa.Column("valid_until", UTC_DATETIME, nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("last_used_at", UTC_DATETIME, nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["provider_accounts.id"],
            name=op.f("fk_provider_old_secrets_account_id_provider_accounts"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_old_secrets")),
    )
    op.create_index(
        "ix_provider_old_secrets_account", "provider_old_secrets", ["account_id", "valid_until"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_provider_old_secrets_account", table_name="provider_old_secrets")
    op.drop_table("provider_old_secrets")
