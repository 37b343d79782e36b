"""Notices for the user of this server: ``{base_url}api/gpus/notices``.

The GPU idle culler posts "this server will be stopped in 10 minutes because
its GPUs are idle" here; the JupyterLab extension shows notices as JupyterLab
notifications and in the GPU panel. Authenticated and authorized like every
Jupyter API (resource ``gpus``): reading needs read access, posting and
deleting need write access, which JupyterHub gives to tokens that may access
this server (the user's own, and services with ``access:servers``).

- ``GET``: ``{"notices": [...]}``, oldest first;
- ``POST`` ``{"message": str, "level": "info"|"warning"|"error", "id": str?, "source": str?}``:
  adds a notice (or replaces the one with the same ``id``); 201 with the notice;
- ``DELETE ?id=ID``: removes it; 204, or 404 when there is none.
"""

from __future__ import annotations

import re
import time
import uuid

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..inputs import OptionsError, dumps, field_name, read_json

SETTINGS_KEY = "gpuspawner_notices"
LEVELS = ("info", "warning", "error")
NOTICE_KEYS = ("message", "level", "id", "source")
_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_MESSAGE = 2000


class NoticeBoard:
    """The newest ``limit`` notices, in memory."""

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self._notices: dict[str, dict] = {}

    def post(self, message: str, level: str = "warning", notice_id: str | None = None, source: str = "") -> dict:
        notice_id = notice_id or uuid.uuid4().hex[:12]
        self._notices.pop(notice_id, None)
        notice = {"id": notice_id, "level": level, "message": message, "source": source, "time": time.time()}
        self._notices[notice_id] = notice
        while len(self._notices) > self.limit:
            self._notices.pop(next(iter(self._notices)))
        return notice

    def remove(self, notice_id: str) -> bool:
        return self._notices.pop(notice_id, None) is not None

    def all(self) -> list[dict]:
        return list(self._notices.values())


def parse_notice(body: bytes) -> dict:
    """Check a POSTed notice; raise HTTP 400 naming the field (at most 100 characters of it repeated)."""
    try:
        data = read_json(body)
        return _notice(data)
    except OptionsError as e:
        raise web.HTTPError(400, "%s", str(e)) from None


def _notice(data: object) -> dict:
    if not isinstance(data, dict):
        raise OptionsError("body", "must be a JSON object")
    unknown = [k for k in data if k not in NOTICE_KEYS]
    if unknown:
        raise OptionsError(field_name(unknown[0]), f"unknown key; allowed: {', '.join(NOTICE_KEYS)}")
    message = data.get("message")
    if not isinstance(message, str) or not message.strip() or len(message) > MAX_MESSAGE:
        raise OptionsError("message", f"must be a non-empty string of at most {MAX_MESSAGE} characters")
    level = data.get("level", "warning")
    if level not in LEVELS:
        raise OptionsError("level", f"must be one of {', '.join(LEVELS)}")
    notice_id = data.get("id")
    if notice_id is not None and (not isinstance(notice_id, str) or not _ID.fullmatch(notice_id)):
        raise OptionsError("id", "1 to 64 letters, digits, '.', '_' or '-'")
    source = data.get("source", "")
    if not isinstance(source, str) or len(source) > 100:
        raise OptionsError("source", "a string of at most 100 characters")
    return {"message": message.strip(), "level": level, "notice_id": notice_id, "source": source}


class NoticesHandler(APIHandler):
    auth_resource = "gpus"
    _track_activity = False

    @property
    def board(self) -> NoticeBoard:
        return self.settings[SETTINGS_KEY]

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.finish(dumps({"notices": self.board.all()}))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        notice = self.board.post(**parse_notice(self.request.body))
        self.log.warning("gpuspawner.monitor: notice from %s: %s", notice["source"] or "a client", notice["message"])
        self.set_status(201)
        self.finish(dumps(notice))

    @web.authenticated
    @authorized
    async def delete(self) -> None:
        notice_id = self.get_argument("id", "")
        if not self.board.remove(notice_id):
            raise web.HTTPError(404, f"no notice {notice_id[:64]!r}")
        self.set_status(204)
        self.finish()
