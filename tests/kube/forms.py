"""What a spawner's options form shows, read from its HTML (shared by the gpu-kube form tests)."""

from __future__ import annotations

from html.parser import HTMLParser

from jupyterhub.utils import maybe_future


async def form_of(spawner) -> str:
    form = spawner.options_form
    return await maybe_future(form(spawner)) if callable(form) else form


class Fields(HTMLParser):
    """Named form controls: selects with their option values, radio values, other inputs."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.selects: dict[str, list[str]] = {}
        self.radios: dict[str, list[str]] = {}
        self.inputs: set[str] = set()
        self._select: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        name = a.get("name") or a.get("data-name")
        if tag == "select":
            self._select = name
            self.selects[name] = []
        elif tag == "option" and self._select:
            self.selects[self._select].append(a.get("value"))
        elif tag == "input" and a.get("type") == "radio":
            self.radios.setdefault(name, []).append(a.get("value"))
        elif tag == "input" and name:
            self.inputs.add(name)

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None


class Checked(HTMLParser):
    """What a form shows chosen: the checked radio per name, the selected option per select, text values."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.radios: dict[str, str] = {}
        self.selected: dict[str, str] = {}
        self.texts: dict[str, str] = {}
        self._select: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "select":
            self._select = a.get("name")
        elif tag == "option" and self._select and "selected" in a:
            self.selected[self._select] = a.get("value")
        elif tag == "input" and a.get("type") == "radio" and "checked" in a:
            self.radios[a["name"]] = a.get("value")
        elif tag == "input" and a.get("type") == "text":
            self.texts[a["name"]] = a.get("value") or ""

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
