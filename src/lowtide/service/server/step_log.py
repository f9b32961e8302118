"""What a step tells the operator's log: each front found dead (once) and stuck
windows (a few lines a minute per segment, with a count of the rest), each with its
fix."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lowtide.service.engine.base import StepResult
from lowtide.service.logs import LogBudget
from lowtide.service.progress import utc_text

if TYPE_CHECKING:
    from lowtide.service.server.config import ServerConfig

log = logging.getLogger("lowtide.service.server")


def log_step(step: StepResult, names: tuple[str, ...], cfg: ServerConfig,
             budget: LogBudget) -> None:
    for dead in step.dead:  # once per front that died
        log.warning("dead front", extra={
            "detail": dead.describe(names, utc_text),
            "policy": dead.policy,
            "fix": "the front's producer stopped heartbeating: restart it (it rejoins), "
                   "or retire it (lowtide serve --dead-fronts retire)"
                   if dead.retired_ms is None else
                   "its items already sent stay tracked: see `lowtide status` (stuck) if "
                   "some were never written"})
    for stuck in step.stuck:
        budget.warn(
            log, ("stuck", stuck.segment), "stuck window", detail=stuck.describe(),
            after_ms=cfg.stuck_after_ms,
            fix=f"items of segment {stuck.segment!r} were lost or are still being "
                "processed: see `lowtide status` (stuck) and the operator that receives them",
        )
