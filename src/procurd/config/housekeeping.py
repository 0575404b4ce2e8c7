"""The sections that keep an installation in order: ``[alerts]``, ``[reconcile]`` and ``[retention]``."""

from __future__ import annotations

from pydantic import Field

from procurd.config.fields import NonNegativeDays, PositiveSeconds, Section


class AlertsSettings(Section):
    urls: list[str] = Field(default_factory=list)
    repeat_after_seconds: PositiveSeconds = 3600
    stuck_after_seconds: PositiveSeconds = 3600
    unhealthy_after_seconds: PositiveSeconds = 300


class ReconcileSettings(Section):
    interval_seconds: PositiveSeconds = 3600
    window_seconds: PositiveSeconds = 604800
    repair: bool = True


class RetentionSettings(Section):
    audit_days: NonNegativeDays = 365
    mirror_changes_days: NonNegativeDays = 90
    outbox_delivered_days: NonNegativeDays = 7
    sync_runs_days: NonNegativeDays = 90
    alerts_days: NonNegativeDays = 90
