"""Template server (FastAPI): pack byte ranges over HTTP and websocket. See :mod:`sakura.server.app`."""

from sakura.server.app import create_app
from sakura.server.run import RunningServer, serve, start_server

__all__ = ["create_app", "serve", "start_server", "RunningServer"]
