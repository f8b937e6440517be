"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) served from the package, so they work offline."""

from __future__ import annotations

from pathlib import Path

# Swagger UI and ReDoc, vendored from npm (swagger-ui-dist, redoc; versions and licences in its README.md): FastAPI's
# own /docs and /redoc load them from a CDN, and are blank offline
APIDOCS = Path(__file__).parent.parent / "static" / "apidocs"
APIDOCS_URL = "/static/apidocs"
SWAGGER_JS, SWAGGER_CSS = "swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui.css"
REDOC_JS, FAVICON = "redoc/redoc.standalone.js", "swagger-ui/favicon-32x32.png"


def _add_api_docs(app) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with every script, style and icon from :data:`APIDOCS` (no
    request leaves the server: no CDN, no web fonts, no online validator)."""
    from fastapi.openapi.docs import (
        get_redoc_html,
        get_swagger_ui_html,
        get_swagger_ui_oauth2_redirect_html,
    )
    from fastapi.staticfiles import StaticFiles

    app.mount(APIDOCS_URL, StaticFiles(directory=APIDOCS), name="apidocs")
    openapi, assets = app.openapi_url, APIDOCS_URL + "/"  # paths from the server's root, as the task's pages use

    @app.get("/docs", include_in_schema=False)
    def swagger_ui():
        return get_swagger_ui_html(openapi_url=openapi, title=f"{app.title} - Swagger UI",
                                   swagger_js_url=assets + SWAGGER_JS, swagger_css_url=assets + SWAGGER_CSS,
                                   swagger_favicon_url=assets + FAVICON,
                                   oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
                                   swagger_ui_parameters={"validatorUrl": None})  # no badge from swagger.io

    @app.get(app.swagger_ui_oauth2_redirect_url, include_in_schema=False)
    def swagger_ui_redirect():
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc():
        return get_redoc_html(openapi_url=openapi, title=f"{app.title} - ReDoc", redoc_js_url=assets + REDOC_JS,
                              redoc_favicon_url=assets + FAVICON, with_google_fonts=False)
