"""Each user's notification settings over REST and on a page; the culler's report of a warning.

- ``GET /hub/api/gpus/notifications``: the caller's own settings: ``{"user", "email", "webhook",
  "events": {channel: {event: true|false}}, "channels", "event_names", "email_on",
  "webhook_prefixes"}``. ``?user=NAME`` names another user: administrators only, anyone else 403.
- ``PUT /hub/api/gpus/notifications`` with ``{"email"?, "webhook"?, "events"?}`` (a key left out
  stays as it was; ``events``: ``{channel: {event: true|false}}``) -> 200 with the settings;
  400 naming the field and saying why, and nothing is stored
  (:func:`gpuspawner.notifications.parse_preferences`).
- ``POST /hub/api/gpus/notifications/events`` with ``{"user", "event", "title", "text", "url"?}``:
  tell a user of an event that happened outside the hub's process (the GPU idle culler's warning
  before a cull). Scope ``custom:gpus:report`` (the culler's role has it) or ``admin:servers``;
  answers 202 at once: the notifier tells in the background.
- ``GET /hub/gpus/notifications``: the settings page (linked from the hub's navigation bar).
"""

from __future__ import annotations

from jupyterhub.apihandlers import APIHandler
from jupyterhub.handlers import BaseHandler
from tornado import web

from ..inputs import OptionsError, dumps, read_json, shown
from ..notifications import EVENTS, TOLD_ELSEWHERE, Teller, parse_preferences
from ..state import hub_state_of_app
from .notify import notifier_of
from .usage import REPORT_ADMIN_SCOPE, REPORT_SCOPE

MAX_TEXT = 2000
#: the keys of an event's body (``url`` may be left out)
EVENT_KEYS = ("user", "event", "title", "text", "url")


class _Settings:
    """Whose settings a request reads or writes: the caller's, or (administrators) ``?user=``'s."""

    def whose(self) -> str:
        me = self.current_user
        if not me:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        named = self.get_argument("user", "") or getattr(me, "name", "")
        admin = bool(getattr(me, "admin", False)) or "admin:users" in self.expanded_scopes
        if named != me.name and not admin:
            raise web.HTTPError(403, f"You may read and change only your own notification settings, "
                                     f"not {shown(named, 40)}'s.")
        return named

    def answer_for(self, user: str) -> dict:
        notifier = notifier_of(self.settings)
        prefixes = list(notifier.settings.gpu_notify_webhook_prefixes)
        return {"user": user, **notifier.preferences(user).as_json(notifier.channels),
                "channels": list(notifier.channels), "event_names": dict(EVENTS), "email_on": notifier.email_on,
                "webhook_prefixes": prefixes}


class NotifySettingsHandler(_Settings, APIHandler):
    """``GET`` and ``PUT`` ``/hub/api/gpus/notifications``."""

    def answer(self, data: dict) -> None:
        self.set_header("Cache-Control", "no-store")
        self.finish(dumps(data))

    async def get(self) -> None:
        self.answer(self.answer_for(self.whose()))

    async def put(self) -> None:
        user = self.whose()
        notifier = notifier_of(self.settings)
        try:
            chosen = parse_preferences(read_json(self.request.body), notifier.preferences(user), notifier.channels,
                                       email_on=notifier.email_on,
                                       prefixes=notifier.settings.gpu_notify_webhook_prefixes)
        except OptionsError as e:
            raise web.HTTPError(400, "%s", str(e)) from e
        notifier.store.put(user, chosen)
        self.answer(self.answer_for(user))


class NotifyEventHandler(APIHandler):
    """``POST /hub/api/gpus/notifications/events``: tell a user of an event seen outside the hub."""

    async def post(self) -> None:
        if not self.current_user or not {REPORT_SCOPE, REPORT_ADMIN_SCOPE} & set(self.expanded_scopes):
            raise web.HTTPError(403, f"Telling users needs the scope {REPORT_SCOPE} or {REPORT_ADMIN_SCOPE}.")
        try:
            body = read_json(self.request.body)
            if not isinstance(body, dict):
                raise OptionsError("body", "must be a JSON object with user, event, title and text")
            unknown = [k for k in body if k not in EVENT_KEYS]
            if unknown:
                raise OptionsError(str(unknown[0])[:40], f"is not a field; the fields are {', '.join(EVENT_KEYS)}")
            fields = {k: body.get(k) for k in EVENT_KEYS}
            for key, value in fields.items():
                if key == "url" and value is None:
                    continue  # the only optional one
                if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
                    raise OptionsError(key, f"must be a non-empty string of at most {MAX_TEXT} characters")
            if fields["event"] not in EVENTS:
                raise OptionsError("event", f"{shown(fields['event'], 20)} is not one of {', '.join(EVENTS)}")
        except OptionsError as e:
            raise web.HTTPError(400, "%s", str(e)) from e
        if self.find_user(fields["user"]) is None:
            raise web.HTTPError(404, f"No user {shown(fields['user'], 40)} on this hub.")
        notifier_of(self.settings)
        hub_state_of_app(self.settings).cache(Teller).later(**fields)
        self.set_status(202)
        self.finish(dumps({"told": fields["user"], "event": fields["event"]}))


class NotifySettingsPageHandler(_Settings, BaseHandler):
    """``GET /hub/gpus/notifications``: the user's own settings, changed by the page's script through the API."""

    @web.authenticated
    async def get(self) -> None:
        data = self.answer_for(self.whose())
        self.set_header("Cache-Control", "no-store")
        self.finish(await self.render_template("gpuspawner_notifications.html", data=data, events=EVENTS,
                                               elsewhere=TOLD_ELSEWHERE))


def handlers() -> list[tuple[str, type]]:
    """Routes for ``c.JupyterHub.extra_handlers`` (JupyterHub prefixes them with ``/hub``)."""
    return [(r"/api/gpus/notifications", NotifySettingsHandler),
            (r"/api/gpus/notifications/events", NotifyEventHandler),
            (r"/gpus/notifications", NotifySettingsPageHandler)]
