"""procurd's two HTTP listeners: the public callback receiver and the admin API (``openapi.yaml``)."""

from procurd.http.admin import make_admin_app
from procurd.http.errors import MAX_BODY_BYTES, ApiError
from procurd.http.public import make_public_app

__all__ = ["MAX_BODY_BYTES", "ApiError", "make_admin_app", "make_public_app"]
