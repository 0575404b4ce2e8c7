"""The admin web console: server-rendered pages under ``/ui/`` on the admin listener.

:func:`setup_console` adds its routes, templates, static files and guard to the admin application. The
console signs operators in with the admin token (a signed session cookie), checks a CSRF token on every form
post, sends a strict Content-Security-Policy with every answer, and acts through the same code as the JSON
API. See docs/console.md.
"""

from procurd.http.console.app import setup_console
from procurd.http.console.context import is_console_path
from procurd.http.console.middleware import console_middleware

__all__ = ["console_middleware", "is_console_path", "setup_console"]
