"""Operations endpoints: liveness and readiness without auth, and metrics (docs/api.md §3)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from starlette.responses import Response

from app.api.auth import Ctx, MetricsReader
from app.api.http import problems
from app.api.problems import NOT_READY, ApiProblem
from app.api.schemas import Health, Problem, ProcessLimit, Ready
from app.api.strict_json import StrictJSONRoute

router = APIRouter(tags=["operations"], route_class=StrictJSONRoute)
_NOT_READY = {
    503: {
        "model": Problem,
        "description": "not ready (NOT_READY); the detail names each failing check "
        "(database, disk, worker) and why",
    }
}


@router.get("/healthz", operation_id="healthz", response_model=Health)
async def healthz() -> Health:
    """The process is alive (touches nothing else)."""
    return Health(status="ok")


@router.get(
    "/readyz", operation_id="readyz", response_model=Ready, responses=problems(extra=_NOT_READY)
)
async def readyz(facade: Ctx) -> Ready:
    """Database at head and taking writes, free space, worker answering; else 503 (< 1 s)."""
    readiness = await run_in_threadpool(facade.readiness)
    if not readiness.ready:
        failing = ", ".join(f"{k}: {v}" for k, v in sorted(readiness.checks.items()) if v != "ok")
        raise ApiProblem(503, NOT_READY, failing)
    isolation = "job_user" if facade.job_isolation == "job_user" else "same_user"
    limit = readiness.facts.get("process_limit")
    return Ready(
        status="ready",
        checks=readiness.checks,
        isolation=isolation,
        process_limit=ProcessLimit(**limit) if limit else None,
    )


METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@router.get(
    "/metrics",
    operation_id="metrics",
    response_class=Response,
    responses={
        **problems(401, 403, 503),
        200: {
            "content": {METRICS_MEDIA_TYPE: {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format (docs/metrics.md)",
        },
    },
)
async def metrics(facade: Ctx, _principal: MetricsReader) -> Response:
    """Runs, queue, attempts, journal and log figures and the dispatch histograms
    (scope ``metrics:read`` or ``admin``); the same answer from every api process."""
    body = await run_in_threadpool(facade.metrics)
    return Response(body, media_type=METRICS_MEDIA_TYPE, headers={"Cache-Control": "no-store"})
