"""Airflow plugin: the "CDC tables" view, behind the same login as the Airflow UI."""

from __future__ import annotations

import html
from typing import Annotated, Any

from airflow.api_fastapi.core_api.security import bearer_scheme, get_user
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from cdc_pipeline.table_status import all_table_status

PREFIX = "/cdc-tables"
COLUMNS = [
    ("name", "Table"),
    ("last_success_interval", "Last successful interval"),
    ("final_version", "Final Delta version"),
    ("final_rows", "Final rows"),
    ("staging_rows", "Rows in staging"),
    ("quarantined_rows", "Quarantined rows"),
    ("last_optimize", "Last optimize"),
    ("last_vacuum", "Last vacuum"),
    ("last_reset", "Last staging reset"),
]
app = FastAPI(title="CDC tables")
Credentials = Annotated[Any, Depends(bearer_scheme)]


async def current_user(request: Request, credentials: Any) -> Any:
    """The logged-in Airflow user (Bearer token or the UI's cookie), or None."""
    try:
        return await get_user(request, None, credentials)
    except HTTPException:
        return None


@app.get("/api/tables")
async def tables_json(request: Request, credentials: Credentials) -> Response:
    """The view's data as JSON; 401 without a login."""
    if await current_user(request, credentials) is None:
        return JSONResponse({"detail": "Not authenticated"}, status_code=401)
    return JSONResponse([s.as_dict() for s in all_table_status()])


@app.get("/", response_class=HTMLResponse)
async def tables_page(request: Request, credentials: Credentials) -> Response:
    """One row per table; redirects to Airflow's login page when not logged in."""
    if await current_user(request, credentials) is None:
        return RedirectResponse(f"/api/v2/auth/login?next={request.url.path}", status_code=307)
    rows = []
    for status in all_table_status():
        data = status.as_dict()
        cells = [
            f'<td><a href="/dags/{html.escape(status.dag_id)}" target="_top">{html.escape(status.name)}</a></td>'
        ]
        cells += [
            f"<td>{html.escape('' if data[key] is None else str(data[key]))}</td>"
            for key, _ in COLUMNS[1:]
        ]
        rows.append(f'<tr id="table-{html.escape(status.name)}">{"".join(cells)}</tr>')
    head = "".join(f"<th>{title}</th>" for _, title in COLUMNS)
    return HTMLResponse(
        "<!doctype html><html><head><title>CDC tables</title><style>"
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}th{background:#f0f0f0}"
        f"</style></head><body><h1>CDC tables</h1><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></body></html>"
    )


class CdcTablesPlugin(AirflowPlugin):
    """Adds the CDC tables view to the Airflow UI (Browse menu)."""

    name = "cdc_tables"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "CDC tables"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "CDC tables",
            "href": f"{PREFIX}/",
            "url_route": "cdc-tables",
            "category": "browse",
        }
    ]
