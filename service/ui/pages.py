"""The pages under ``/ui``: runs and snapshots, a snapshot, a run's norms over steps, a diff.

Every page is rendered on the server (Jinja2), tables and bar charts included, so it reads
with JavaScript off; only the run page's line chart is drawn by a script (uPlot, served
from this package), from ``/ui/api/run-stats``, which is built from manifests alone.
"""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from gradvault.core import SnapshotNotFoundError

from ..auth import access_refusal
from ..deps import ConditionsDep, IndexDep, MetricsDep, SettingsDep, StoreDep
from ..errors import PageOutOfRangeError
from ..params import MAX_STEP, SNAPSHOT_ID_PATTERN, ParamIdPath, RankQuery, SnapshotIdPath
from ..queries import open_gradient, open_safetensors, snapshot_manifest
from ..ranges import ranged_response
from ..schemas import SnapshotDetail
from ..settings import Scope
from .access import TOKEN_COOKIE, UI_PREFIX, DataReader, PageReader, read_login_form, safe_next
from .bars import norm_chart, ratio_length
from .stats import SnapshotStats, SnapshotStatsCache, run_series

#: snapshots per page of a listing
PAGE_SIZE = 50

router = APIRouter(prefix=UI_PREFIX, include_in_schema=False)
root_router = APIRouter(include_in_schema=False)

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")

#: the pages load scripts, styles and data from this service only
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def human_bytes(count: int) -> str:
    """``1536`` as ``1.5 KiB``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def number(value: float | None) -> str:
    """A norm or ratio in four significant digits; ``inf`` and missing values spelled out."""
    if value is None:
        return "—"
    if math.isinf(value):
        return "Infinity"
    return f"{value:.4g}"


def timestamp(created_at: str) -> str:
    """``2026-12-02T21:06:44.123Z`` as ``2026-12-02 21:06:44``."""
    return created_at.replace("T", " ")[:19]


templates.env.filters.update(bytes=human_bytes, number=number, timestamp=timestamp)


def _stats_cache(request: Request, store: StoreDep) -> SnapshotStatsCache:
    cache = getattr(request.app.state, "ui_stats", None)
    if cache is None or cache.store is not store:
        cache = request.app.state.ui_stats = SnapshotStatsCache(store)
    return cache


def _render(
    request: Request, template: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    settings = request.app.state.settings
    signed_in = not settings.is_open and request.cookies.get(TOKEN_COOKIE) is not None
    response = templates.TemplateResponse(
        request,
        template,
        {"signed_in": signed_in, "ui": UI_PREFIX, **context},
        status_code=status_code,
    )
    response.headers.update(SECURITY_HEADERS)
    return response


def _link(path: str, **query: object) -> str:
    present = {key: value for key, value in query.items() if value is not None}
    return f"{UI_PREFIX}{path}" + (f"?{urlencode(present)}" if present else "")


@root_router.get("/")
async def root() -> RedirectResponse:
    """The pages live under /ui."""
    return RedirectResponse(UI_PREFIX, status_code=307)


#: points per layer the run chart asks for at most
DEFAULT_MAX_POINTS = 1000
MaxPointsQuery = Annotated[int, Query(ge=2, le=10_000, description="points per layer at most")]

CursorQuery = Annotated[
    str | None,
    Query(description="next page after this id", pattern=SNAPSHOT_ID_PATTERN),
]


@router.get("", dependencies=[PageReader])
async def overview(
    request: Request, index: IndexDep, store: StoreDep, cursor: CursorQuery = None
) -> HTMLResponse:
    """Runs, and every snapshot newest first with its health, a page at a time."""
    everything, _ = await index.page(limit=sys.maxsize)
    runs: dict[str, dict[str, Any]] = {}
    for info in everything:  # newest first: the first seen of a run is its latest
        run = runs.setdefault(
            info.run, {"name": info.run, "count": 0, "latest": info, "link": _run_link(info.run)}
        )
        run["count"] += 1
    infos, next_cursor = await index.page(limit=PAGE_SIZE, cursor=cursor)
    rows = await _stats_cache(request, store).many([info.id for info in infos])
    return _render(
        request,
        "overview.html",
        {
            "runs": sorted(runs.values(), key=lambda run: run["latest"].id, reverse=True),
            "rows": rows,
            "show_run": True,
            "next_link": _link("", cursor=next_cursor) if next_cursor else None,
            "first_link": _link("") if cursor else None,
            "total": len(everything),
        },
    )


def _run_link(run: str, **query: object) -> str:
    return _link("/run", run=run, **query)


@router.get("/run", dependencies=[PageReader])
async def run_page(
    request: Request,
    index: IndexDep,
    store: StoreDep,
    run: Annotated[str, Query(min_length=1, description="the run")],
    cursor: CursorQuery = None,
    max_points: MaxPointsQuery = DEFAULT_MAX_POINTS,
) -> HTMLResponse:
    """One run: its norms over steps (drawn from run-stats), and its snapshots."""
    infos, next_cursor = await index.page(run=run, limit=PAGE_SIZE, cursor=cursor)
    rows = await _stats_cache(request, store).many([info.id for info in infos])
    return _render(
        request,
        "run.html",
        {
            "run": run,
            "rows": rows,
            "show_run": False,
            "stats_url": _link("/api/run-stats", run=run, max_points=max_points),
            "next_link": _run_link(run, cursor=next_cursor) if next_cursor else None,
            "first_link": _run_link(run) if cursor else None,
        },
    )


@router.get("/api/run-stats", dependencies=[DataReader])
async def run_stats(
    request: Request,
    index: IndexDep,
    store: StoreDep,
    run: Annotated[str, Query(min_length=1)],
    step_min: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    max_points: MaxPointsQuery = DEFAULT_MAX_POINTS,
) -> Response:
    """Per-layer L2 norms over steps and the steps with NaN/Inf, from manifests only."""
    infos, _ = await index.page(run=run, step_min=step_min, step_max=step_max, limit=sys.maxsize)
    snapshots = await _stats_cache(request, store).many([info.id for info in infos])
    body = run_series(run, snapshots, max_points)
    body["step_min"], body["step_max"] = step_min, step_max
    return Response(
        orjson.dumps(body), media_type="application/json", headers={"Cache-Control": "no-store"}
    )


SortColumn = Literal[
    "position", "name", "param_id", "shape", "dtype", "l2_norm", "max_abs", "nan_count", "inf_count"
]
SortOrder = Literal["asc", "desc"]

#: gradients per page of a snapshot's table (a page of 100,000 would be ~60 MB of HTML)
GRADIENTS_PER_PAGE = 500
PageQuery = Annotated[
    int, Query(ge=1, le=2**31, description=f"page of {GRADIENTS_PER_PAGE} gradients, from 1")
]

_COLUMNS = [
    ("position", "#"),
    ("name", "name"),
    ("param_id", "ParamId"),
    ("shape", "shape"),
    ("dtype", "dtype"),
    ("l2_norm", "L2 norm"),
    ("max_abs", "max |g|"),
    ("nan_count", "NaN"),
    ("inf_count", "Inf"),
]
_NO_GRADIENTS: dict[str, list[Any]] = {
    key: [] for key in ("param_id", "name", "dtype", "shape", "nbytes")
}
_NO_STATS: dict[str, list[Any]] = {
    key: [] for key in ("l2_norm", "max_abs", "nan_count", "inf_count")
}


def _as_number(value: float | str) -> float:
    return math.inf if value == "Infinity" else float(value)


def _sort_key(table: dict[str, Any], column: SortColumn) -> Any:
    """The key that orders gradient positions by ``column`` of the manifest's table."""
    if column == "shape":
        shapes = table["shape"]
        return lambda i: (math.prod(shapes[i]), shapes[i])
    if column in ("l2_norm", "max_abs"):
        numbers = [_as_number(value) for value in table["stats"][column]]
        return numbers.__getitem__
    if column in ("nan_count", "inf_count"):
        return table["stats"][column].__getitem__
    return table[column].__getitem__


@router.get("/snapshots/{snapshot_id}", dependencies=[PageReader])
async def snapshot_page(
    request: Request,
    snapshot_id: SnapshotIdPath,
    store: StoreDep,
    sort: SortColumn = "position",
    order: SortOrder = "asc",
    page: PageQuery = 1,
    rank: RankQuery = None,
) -> HTMLResponse:
    """One snapshot: a sortable table of its gradients, a page at a time, and their norms;
    of a sharded snapshot, a table of its ranks (``rank``: one rank's shard, as a snapshot)."""
    manifest = await snapshot_manifest(store, snapshot_id, rank)
    if rank is None and manifest.get("world_size") is not None:
        return await _sharded_page(request, store, manifest)
    # sorting 100,000 gradients and rendering a page take CPU: off the event loop
    return await asyncio.to_thread(_snapshot_page, request, manifest, sort, order, page, rank)


async def _sharded_page(
    request: Request, store: StoreDep, manifest: dict[str, Any]
) -> HTMLResponse:
    """A sharded snapshot: its summary and its ranks, each with its health and links."""
    snapshot_id = manifest["id"]
    found = await _stats_cache(request, store).many([snapshot_id])
    if not found:
        raise SnapshotNotFoundError(f"snapshot {snapshot_id} was deleted while it was read")
    stats = found[0]
    detail = SnapshotDetail.of_manifest(manifest)
    ranks = [
        {
            "shard": shard,
            "stats": rank_stats,
            "link": _link(f"/snapshots/{snapshot_id}", rank=shard.rank),
            "safetensors_link": _link(f"/snapshots/{snapshot_id}/safetensors", rank=shard.rank),
        }
        for shard, rank_stats in zip(detail.shards or [], stats.ranks, strict=True)
    ]
    return _render(
        request,
        "sharded.html",
        {"detail": detail, "stats": stats, "ranks": ranks, "run_link": _run_link(detail.run)},
    )


def _snapshot_page(
    request: Request,
    manifest: dict[str, Any],
    sort: SortColumn,
    order: SortOrder,
    page: int,
    rank: int | None = None,
) -> HTMLResponse:
    snapshot_id = manifest["id"]
    table = manifest.get("gradients") or {**_NO_GRADIENTS, "stats": _NO_STATS}
    count = len(table["param_id"])
    pages = max(1, -(-count // GRADIENTS_PER_PAGE))
    if page > pages:
        raise PageOutOfRangeError(
            f"snapshot {snapshot_id} has {count} gradients, {pages} page(s) of "
            f"{GRADIENTS_PER_PAGE}; page {page} is past the last"
        )
    positions = list(range(count))
    if sort != "position":
        positions.sort(key=_sort_key(table, sort))
    if order == "desc":
        positions.reverse()
    first = (page - 1) * GRADIENTS_PER_PAGE
    shown = positions[first : first + GRADIENTS_PER_PAGE]
    stats = table["stats"]
    rows = [
        {
            "position": i,
            "param_id": table["param_id"][i],
            "name": table["name"][i],
            "shape": table["shape"][i],
            "dtype": table["dtype"][i],
            "nbytes": table["nbytes"][i],
            "l2_norm": _as_number(stats["l2_norm"][i]),
            "max_abs": _as_number(stats["max_abs"][i]),
            "nan_count": stats["nan_count"][i],
            "inf_count": stats["inf_count"][i],
            "npy_link": _link(
                f"/snapshots/{snapshot_id}/grads/{table['param_id'][i]}.npy", rank=rank
            ),
        }
        for i in shown
    ]
    charted = sorted(rows, key=lambda row: row["position"])  # the page's gradients, in order
    chart = norm_chart(
        [row["name"] for row in charted],
        [row["l2_norm"] for row in charted],
        [bool(row["nan_count"] or row["inf_count"]) for row in charted],
    )
    headers = [
        {
            "key": key,
            "label": label,
            "sorted": order if key == sort else None,
            "link": _link(
                f"/snapshots/{snapshot_id}",
                rank=rank,
                sort=key,
                order="desc" if key == sort and order == "asc" else "asc",
            ),
        }
        for key, label in _COLUMNS
    ]

    def page_link(number: int) -> str | None:
        if not 1 <= number <= pages or number == page:
            return None
        default = sort == "position" and order == "asc"
        return _link(
            f"/snapshots/{snapshot_id}",
            rank=rank,
            sort=None if default else sort,
            order=None if default else order,
            page=number if number > 1 else None,
        )

    detail = SnapshotDetail.of_manifest({**manifest, "gradients": None})  # its summary only
    return _render(
        request,
        "snapshot.html",
        {
            "detail": detail,
            "stats": SnapshotStats.of_manifest(manifest),
            "rows": rows,
            "headers": headers,
            "chart": chart,
            "pager": {
                "page": page,
                "pages": pages,
                "first_shown": first + 1 if rows else 0,
                "last_shown": first + len(rows),
                "count": count,
                "first": page_link(1),
                "previous": page_link(page - 1),
                "next": page_link(page + 1),
                "last": page_link(pages),
            },
            "run_link": _run_link(detail.run),
            "safetensors_link": _link(f"/snapshots/{snapshot_id}/safetensors", rank=rank),
            "whole_link": None if rank is None else _link(f"/snapshots/{snapshot_id}"),
        },
    )


@router.get("/diff", dependencies=[PageReader])
async def diff_page(
    request: Request,
    store: StoreDep,
    a: Annotated[str, Query(pattern=SNAPSHOT_ID_PATTERN, description="the earlier snapshot")],
    b: Annotated[str, Query(pattern=SNAPSHOT_ID_PATTERN, description="the later snapshot")],
    sort: Literal["position", "name", "ratio"] = "position",
) -> HTMLResponse:
    """Two snapshots side by side: each layer's norm in both and their ratio (b / a)."""
    first, second = [
        SnapshotStats.of_manifest(await snapshot_manifest(store, snapshot_id))
        for snapshot_id in (a, b)
    ]
    rows = _diff_rows(first, second)
    if sort == "name":
        rows.sort(key=lambda row: row["name"])
    elif sort == "ratio":
        rows.sort(key=_change_first)
    return _render(
        request,
        "diff.html",
        {
            "a": first,
            "b": second,
            "rows": rows,
            "sort": sort,
            "sort_links": {
                key: _link("/diff", a=a, b=b, sort=key) for key in ("position", "name", "ratio")
            },
            "swap_link": _link("/diff", a=b, b=a, sort=sort),
        },
    )


def _diff_rows(first: SnapshotStats, second: SnapshotStats) -> list[dict[str, Any]]:
    """One row per ParamId in either snapshot, in ``first``'s order then ``second``'s."""
    place_in_second = {param_id: i for i, param_id in enumerate(second.param_ids)}
    order = list(first.param_ids) + [p for p in second.param_ids if p not in set(first.param_ids)]
    place_in_first = {param_id: i for i, param_id in enumerate(first.param_ids)}
    rows = []
    for param_id in order:
        i, j = place_in_first.get(param_id), place_in_second.get(param_id)
        norm_a = first.l2_norms[i] if i is not None else None
        norm_b = second.l2_norms[j] if j is not None else None
        ratio = None
        if norm_a is not None and norm_b is not None and 0 < norm_a < math.inf:
            ratio = norm_b / norm_a if math.isfinite(norm_b) else math.inf
        bad_a = i is not None and not _finite_at(first, i)
        bad_b = j is not None and not _finite_at(second, j)
        if i is not None:
            name = first.names[i]
        else:
            assert j is not None  # the id is in one snapshot at least
            name = second.names[j]
        rows.append(
            {
                "param_id": param_id,
                "name": name,
                "norm_a": norm_a,
                "norm_b": norm_b,
                "bad_a": bad_a,
                "bad_b": bad_b,
                "ratio": ratio,
                "ratio_length": ratio_length(ratio),
            }
        )
    return rows


def _change_first(row: dict[str, Any]) -> float:
    """Sort key: the biggest change either way first (from or to zero or Inf before any
    finite ratio), rows without a ratio last."""
    ratio = row["ratio"]
    if ratio is None:
        return math.inf
    if not 0 < ratio < math.inf:
        return -math.inf
    return -abs(math.log(ratio))


def _finite_at(stats: SnapshotStats, position: int) -> bool:
    return (
        not stats.nan_counts[position]
        and not stats.inf_counts[position]
        and math.isfinite(stats.l2_norms[position])
    )


@router.get("/snapshots/{snapshot_id}/grads/{param_id}.npy", dependencies=[DataReader])
async def download_gradient(
    snapshot_id: SnapshotIdPath,
    param_id: ParamIdPath,
    store: StoreDep,
    metrics: MetricsDep,
    conditions: ConditionsDep,
    rank: RankQuery = None,
) -> Response:
    """The gradient as a .npy file: the API's answer, with a file name to save it under."""
    gradient = await open_gradient(store, snapshot_id, param_id, "npy", rank)
    response = await ranged_response(conditions, gradient, metrics)
    shard = "" if rank is None else f"-rank{rank}"
    response.headers["Content-Disposition"] = (
        f'attachment; filename="{gradient.snapshot_id}{shard}-{gradient.param_id}.npy"'
    )
    return response


@router.get("/snapshots/{snapshot_id}/safetensors", dependencies=[DataReader])
async def download_safetensors(
    snapshot_id: SnapshotIdPath,
    store: StoreDep,
    metrics: MetricsDep,
    conditions: ConditionsDep,
    rank: RankQuery = None,
) -> Response:
    """The whole snapshot (a sharded one's rank ``rank``) as one safetensors file: the API's
    answer."""
    safetensors = await open_safetensors(store, snapshot_id, rank)
    return await ranged_response(conditions, safetensors, metrics)


@router.get("/login")
async def login_form(request: Request, settings: SettingsDep, next: str | None = None) -> Response:
    """The form that asks for a token (only when the service needs one)."""
    if settings.is_open:
        return RedirectResponse(safe_next(next), status_code=303)
    return _render(request, "login.html", {"next": safe_next(next), "problem": None})


@router.post("/login")
async def login(request: Request, settings: SettingsDep) -> Response:
    """Check the token from the form; keep it in an HttpOnly cookie and go to the page."""
    form = await read_login_form(request)
    token, next_path = form.token, form.next_path
    if settings.is_open:
        return RedirectResponse(next_path, status_code=303)
    if not token:
        problem = "enter a token"
    elif access_refusal(settings, token, Scope.READ) is not None:
        problem = "that token is not one this service knows"
    else:
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(
            TOKEN_COOKIE,
            token,
            path=UI_PREFIX,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response
    return _render(request, "login.html", {"next": next_path, "problem": problem}, status_code=401)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Forget the token: the cookie is cleared."""
    response = RedirectResponse(f"{UI_PREFIX}/login", status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path=UI_PREFIX, httponly=True, samesite="strict")
    return response
