"""The web dashboard: server-rendered pages that draw their charts with plotly.js.

Routes (mounted by :func:`api.app.create_app`, hidden from the OpenAPI document):

* ``GET /``: every study with its status, progress, best objective and elapsed time;
  refreshes itself while a study is queued or running.
* ``GET /studies/{id}``: one study (trial table, learning curves, schedule pictures,
  accuracy against cost with its Pareto front, parameter importance, best vs baselines,
  downloads). The page data is embedded in the HTML: one request draws the page.
* ``GET /dashboard/data/studies/{id}``: the same page data as JSON, for the page's live
  updates (``?since=<server_time>`` returns only trials that changed; ETag / 304).
* ``GET /dashboard/data/studies/{id}/trials/{number}/schedule``: one trial's schedule picture
  (batch size and LR per epoch), when the user picks a trial.
* ``GET /dashboard/data/studies/{id}/importance``: Optuna parameter importance (cached; it
  is computed from the Optuna storage in the same database).
* ``GET /dashboard/static/{name}``: the page's JS and CSS, and ``plotly.min.js`` streamed
  from the installed plotly package (no CDN; cached by the browser).

The pages and data follow the API's read authentication (:func:`api.deps.authorize`); the
static assets are public.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from api import dashboard_data as dd
from api.deps import StoreDep, authorize
from api.errors import ApiError
from api.query import single_valued_query
from api.routes import API_PREFIX
from api.routes.params import StudyId, TrialNumber
from tuner import __version__
from tuner.errors import NotFoundError
from tuner.noise_candidate import step_floor_of_epochs
from tuner.store import MAX_PAGE_SIZE, StudyStore, TrialRecord, TrialStatus

__all__ = ["DATA_PREFIX", "STATIC_PREFIX", "router"]

HERE: Final = Path(__file__).resolve().parent
STATIC_DIR: Final = HERE / "static"
TEMPLATES_DIR: Final = HERE / "templates"
STATIC_PREFIX: Final = "/dashboard/static"
DATA_PREFIX: Final = "/dashboard/data"

#: How many studies the studies page lists (newest first).
STUDIES_SHOWN: Final = 200
#: While a study runs, its parameter importance is recomputed at most this often.
IMPORTANCE_REFRESH_S: Final = 30.0
#: Own assets that may be served (name -> media type).
_OWN_ASSETS: Final = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_IMMUTABLE: Final = "public, max-age=31536000, immutable"
_REVALIDATE: Final = "public, max-age=300"
_GZIP_MIN_BYTES: Final = 1024

templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
templates.env.filters["duration"] = dd.format_duration


# -- static assets ---------------------------------------------------------------------------


@dataclass
class _Asset:
    body: bytes
    media_type: str
    etag: str
    version: str
    gzipped: bytes | None = None
    """Compressed on the first request that accepts gzip (pages only need the version)."""


_assets: dict[str, _Asset] = {}
_assets_lock = threading.Lock()


def plotly_js_path() -> Path:
    """``plotly.min.js`` as shipped in the installed plotly package."""
    spec = importlib.util.find_spec("plotly")  # no import: plotly's Python side is not needed
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the plotly package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"


def _load_asset(name: str) -> _Asset:
    with _assets_lock:
        cached = _assets.get(name)
        if cached is not None:
            return cached
        if name == "plotly.min.js":
            path, media_type = plotly_js_path(), "text/javascript; charset=utf-8"
        else:
            path, media_type = STATIC_DIR / name, _OWN_ASSETS[name]
        body = path.read_bytes()
        version = hashlib.blake2b(body, digest_size=8).hexdigest()
        asset = _Asset(body, media_type, f'"{version}"', version)
        _assets[name] = asset
        return asset


def _gzipped_asset(name: str) -> bytes:
    asset = _load_asset(name)
    with _assets_lock:
        if asset.gzipped is None:
            asset.gzipped = gzip.compress(asset.body, 6, mtime=0)
        return asset.gzipped


def asset_url(name: str) -> str:
    """The versioned URL of an asset (cached for a year: a new file gets a new URL)."""
    return f"{STATIC_PREFIX}/{name}?v={_load_asset(name).version}"


def _accepts_gzip(request: Request) -> bool:
    return "gzip" in request.headers.get("accept-encoding", "").lower()


def _etag_matches(request: Request, etag: str) -> bool:
    given = request.headers.get("if-none-match")
    if not given:
        return False
    return given.strip() == "*" or etag in [t.strip() for t in given.split(",")]


def _body_response(
    request: Request,
    body: bytes,
    media_type: str,
    *,
    headers: dict[str, str],
    gzipped: bytes | None = None,
    status_code: int = 200,
) -> Response:
    """``body``, gzip-compressed when the client accepts it and it is worth it."""
    headers = {**headers, "Vary": "Accept-Encoding"}
    if _accepts_gzip(request) and len(body) >= _GZIP_MIN_BYTES:
        packed = gzipped if gzipped is not None else gzip.compress(body, 5, mtime=0)
        headers["Content-Encoding"] = "gzip"
        return Response(packed, status_code, headers=headers, media_type=media_type)
    return Response(body, status_code, headers=headers, media_type=media_type)


# -- routers ------------------------------------------------------------------------------------

assets = APIRouter(include_in_schema=False)
pages = APIRouter(include_in_schema=False, dependencies=[Depends(authorize)])


@assets.get(STATIC_PREFIX + "/{name}", name="dashboard_asset")
async def dashboard_asset(request: Request, name: str) -> Response:
    """A dashboard asset; ``plotly.min.js`` comes from the installed plotly package."""
    if name != "plotly.min.js" and name not in _OWN_ASSETS:
        raise ApiError(404, f"no dashboard asset {name!r}")
    asset = await run_in_threadpool(_load_asset, name)
    versioned = request.query_params.get("v") == asset.version
    headers = {"ETag": asset.etag, "Cache-Control": _IMMUTABLE if versioned else _REVALIDATE}
    if _etag_matches(request, asset.etag):
        return Response(status_code=304, headers=headers)
    packed = None
    if _accepts_gzip(request) and len(asset.body) >= _GZIP_MIN_BYTES:
        packed = await run_in_threadpool(_gzipped_asset, name)
    return _body_response(request, asset.body, asset.media_type, headers=headers, gzipped=packed)


def _render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> Response:
    base = {
        "version": __version__,
        "plotly_url": asset_url("plotly.min.js"),
        "js_url": asset_url("dashboard.js"),
        "css_url": asset_url("dashboard.css"),
        "favicon_url": asset_url("favicon.svg"),
        "api_prefix": API_PREFIX,
    }
    html = templates.get_template(name).render({"request": request, **base, **context})
    return _body_response(
        request,
        html.encode("utf-8"),
        "text/html; charset=utf-8",
        headers={"Cache-Control": "no-store"},
        status_code=status_code,
    )


def _not_found(request: Request, message: str) -> Response:
    return _render(request, "not_found.html", {"message": message}, status_code=404)


@pages.get("/", response_class=HTMLResponse, name="dashboard_studies")
def studies_page(request: Request, store: StoreDep) -> Response:
    """Every study: status, progress, best objective so far, elapsed time, task."""
    page = store.list_studies(limit=STUDIES_SHOWN)
    now = datetime.now(UTC)
    rows = [dd.study_row(s, now) for s in page.items]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return _render(
        request,
        "studies.html",
        {
            "studies": rows,
            "total": page.total,
            "counts": counts,
            "live": any(not row["finished"] for row in rows),
            "now": now.strftime("%H:%M:%S UTC"),
        },
    )


def _all_trials(store: StudyStore, study_id: int) -> list[TrialRecord]:
    trials: list[TrialRecord] = []
    while True:
        page = store.list_trials(study_id, limit=MAX_PAGE_SIZE, offset=len(trials))
        trials.extend(page.items)
        if not page.items or not page.has_more:
            return trials


def _page_data(
    store: StudyStore, study_id: int, since: datetime | None
) -> tuple[datetime, dict[str, Any]]:
    """The page data and the server time it was read at."""
    # Trials and curves first, the study last: the header's counts are never behind the rows.
    # The metric from the spec first (it never changes), so curves and trials agree.
    metric = dd.study_metric(store.get_study(study_id).spec)[0]
    trials = _all_trials(store, study_id)
    curves = store.metric_curves(study_id, metric)
    study = store.get_study(study_id)
    now = datetime.now(UTC)
    small = next((t for t in trials if t.baseline == "small_batch"), None)
    measured = store.trial_metrics(small.id) if small is not None else []
    noise = [(m.epoch, m.noise_scale) for m in measured]
    floor = step_floor_of_epochs(measured)
    data = dd.study_page_data(
        study,
        trials,
        curves,
        now=now,
        since=since,
        noise=(
            dd.NoiseCurve(small.number, noise, floor, small.status is TrialStatus.RUNNING)
            if small is not None
            else None
        ),
        origins=store.epoch_origins(study_id, metric),
    )
    data["links"] = {
        "study_api": f"{API_PREFIX}/studies/{study_id}",
        "best_yaml": f"{API_PREFIX}/studies/{study_id}/schedule.yaml",
        "trial_yaml": f"{API_PREFIX}/studies/{study_id}/trials/{{number}}/schedule.yaml",
        "data": f"{DATA_PREFIX}/studies/{study_id}",
        "schedule": f"{DATA_PREFIX}/studies/{study_id}/trials/{{number}}/schedule",
        "importance": f"{DATA_PREFIX}/studies/{study_id}/importance",
    }
    data["live"] = dd.is_live(study)
    return now, data


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _script_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>`` break-out)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@pages.get("/studies/{study_id}", response_class=HTMLResponse, name="dashboard_study")
def study_page(request: Request, store: StoreDep, study_id: StudyId) -> Response:
    """One study, with its data embedded (the page needs no second request to draw)."""
    try:
        now, data = _page_data(store, study_id, None)
    except NotFoundError:
        return _not_found(request, f"Study {study_id} does not exist.")
    return _render(
        request,
        "study.html",
        {
            "study": data["study"],
            "data_json": _script_json({**data, "server_time": _iso(now)}),
            "links": data["links"],
        },
    )


def _parse_since(value: str | None) -> datetime | None:
    if value is None or not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        message = f"since must be an ISO 8601 time (a server_time), not {value!r}"
        raise ApiError(422, message) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@pages.get(DATA_PREFIX + "/studies/{study_id}", name="dashboard_study_data")
def study_data(
    request: Request,
    store: StoreDep,
    study_id: StudyId,
    since: Annotated[
        str | None,
        Query(max_length=64, description="server_time of an earlier answer: only changes"),
    ] = None,
) -> Response:
    """The study page's data as JSON (``If-None-Match`` with the last ETag: 304 if unchanged).
    The ``X-Server-Time`` header is the time it was read at: the next ``since``."""
    now, data = _page_data(store, study_id, _parse_since(since))
    body = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    etag = dd.data_etag(body)
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Server-Time": _iso(now)}
    if _etag_matches(request, etag):
        return Response(status_code=304, headers=headers)
    return _body_response(request, body, "application/json", headers=headers)


@pages.get(
    DATA_PREFIX + "/studies/{study_id}/trials/{number}/schedule", name="dashboard_trial_schedule"
)
def trial_schedule(store: StoreDep, study_id: StudyId, number: TrialNumber) -> dict[str, Any]:
    """One trial's schedule picture (batch size and LR against epoch)."""
    trial = store.get_trial(study_id, number)
    picture = dd.schedule_picture(trial.schedule)
    if picture is None:
        raise ApiError(500, f"trial {number} of study {study_id} has an invalid schedule")
    return {"number": trial.number, "baseline": trial.baseline, **picture}


# -- parameter importance (cached: fANOVA takes a moment on many trials) -----------------------


@dataclass
class _Importance:
    key: tuple[Any, ...]
    computed_at: float
    result: dict[str, Any]


_importance: dict[tuple[str, int], _Importance] = {}
_importance_lock = threading.Lock()


def _importance_for(store: StudyStore, study_id: int) -> dict[str, Any]:
    study = store.get_study(study_id)
    url = store.url.render_as_string(hide_password=False)
    cache_key = (url, study_id)
    # Recompute when trials finished since, but while the study runs at most every
    # IMPORTANCE_REFRESH_S; a finished study's answer never changes.
    key = (study.trials_done, study.status.value, study.best_trial_number)
    with _importance_lock:
        cached = _importance.get(cache_key)
    now = time.monotonic()
    if cached is not None and (
        cached.key == key or (dd.is_live(study) and now - cached.computed_at < IMPORTANCE_REFRESH_S)
    ):
        return {**cached.result, "cached": True}
    result = dd.param_importance(url, study)
    result["trials_done"] = study.trials_done
    with _importance_lock:
        _importance[cache_key] = _Importance(key, now, result)
    return {**result, "cached": False}


@pages.get(DATA_PREFIX + "/studies/{study_id}/importance", name="dashboard_importance")
def importance(store: StoreDep, study_id: StudyId) -> dict[str, Any]:
    """Optuna's parameter importance for the study, or ``available: false`` with a note."""
    return _importance_for(store, study_id)


router = APIRouter(include_in_schema=False, dependencies=[Depends(single_valued_query)])
router.include_router(assets)
router.include_router(pages)
