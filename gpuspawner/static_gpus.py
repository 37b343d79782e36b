"""The configured ``static_gpus``: one read-only list for every spawner and settings object of a hub.

traitlets deep-copies each configured value into each object it configures, and JupyterHub makes a
spawner for each user: with 10,000 GPUs that copy took a third of a second per spawner, checking the
entries as dicts 10 ms more, and writing the hub state's key (JSON) 20 ms more. The configured list is
replaced, in the configuration, by a :class:`SharedGPUs` with the same entries before traitlets reads it
(:func:`share_static_gpus`, from ``GPUHubSettings._load_config``); :class:`StaticGPUList`, the setting's
trait type, takes it as it is. The entries are checked once, by the setting's validator (``state.py``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from traitlets import List

if TYPE_CHECKING:
    from traitlets.config import Config


class SharedGPUs(list):
    """A configured ``static_gpus`` list, one object shared by every spawner and settings object of a hub.

    traitlets deep-copies each configured value into each object it configures (10,000 entries:
    a third of a second per spawner); this list is read-only, so it is handed over as it is
    (``deepcopy`` returns it), and its JSON (the hub state's key) is written once.
    """

    #: whether the entries were found valid (by the setting's validator, once for every spawner)
    checked = False

    def __deepcopy__(self, memo: dict) -> SharedGPUs:
        return self

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the configured static_gpus are shared by every spawner and cannot be changed in place; "
                        "set static_gpus to a new list")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only  # type: ignore[assignment]

    def json(self) -> str:
        """``static_gpus`` as JSON with sorted keys, written at the first call."""
        text = self.__dict__.get("_json")
        if text is None:
            text = self.__dict__["_json"] = gpus_json(list(self))
        return text


def gpus_json(value: list) -> str:
    """``static_gpus`` as JSON with sorted keys (a :class:`SharedGPUs`: written once)."""
    return value.json() if isinstance(value, SharedGPUs) else json.dumps(value, sort_keys=True)


def share_static_gpus(config: Config, sections: list[str]) -> None:
    """Replace each plain ``static_gpus`` list configured in ``sections`` of ``config`` by a :class:`SharedGPUs`
    with the same entries (the configuration's own value: set it anew to change it)."""
    for section in sections:
        if config._has_section(section):
            value = config[section].get("static_gpus")
            if type(value) is list:
                config[section]["static_gpus"] = SharedGPUs(value)


class StaticGPUList(List):
    """``List(Dict())`` that takes a :class:`SharedGPUs` as it is (no copy, its entries checked once by the
    ``static_gpus`` validator)."""

    def validate_elements(self, obj: Any, value: Any) -> Any:
        return value if isinstance(value, SharedGPUs) else super().validate_elements(obj, value)
