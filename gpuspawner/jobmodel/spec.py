"""Pure: what a job request says, checked, and how a job is named in the ledger.

A job's body (``POST /hub/api/users/NAME/gpu-jobs``) holds the same GPU choice
as a server's user_options (``profile``, ``gpus``, ``gpu_model``, ``image``)
plus what to run:

==================  ==========================================================
``notebook``        the notebook to run, a path relative to the user's files
``outputs``         ``{format: path}``: where the executed notebook goes
                    (``ipynb``; ``html`` too if asked), relative paths
``log``             optional: where the job's log goes (default: beside the
                    first output, ``<name>.log``)
``parameters``      optional ``{name: value}`` (strings, numbers, booleans):
                    set in a cell after the notebook's ``parameters`` cell
``kernel``          optional kernel name (default: the notebook's own)
``time_limit``      optional seconds (at most the hub's ``gpu_job_time_limit``)
``name``            optional display name
``id``              optional: the job's id, a UUID in lowercase hexadecimal,
                    32 digits or with its four dashes (JupyterLab's job list
                    sends its own Job ID, so both show the same one); default:
                    a new one. Refused (409) when a job with that id exists
==================  ==========================================================

Paths name files inside the user's files: absolute paths, ``..``, folders
(``.``) and names no file system takes are refused, as is anything else
unexpected (NaN, lone surrogates, deep nesting: :mod:`gpuspawner.inputs`), with
a short message naming the field, before anything is reserved or recorded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from ..inputs import OptionsError, check_json, check_text, field_name, shown
from ..profiles import OPTION_KEYS

JOB_KEYS = ("notebook", "outputs", "log", "parameters", "kernel", "time_limit", "name", "id")
OUTPUT_FORMATS = ("ipynb", "html")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_KERNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: the ids of jobs: a UUID, as the hub makes it (uuid4().hex) or with dashes (as jupyter-scheduler makes it)
JOB_ID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MAX_TEXT = 4096  # characters of a parameter's text value
_MAX_PATH = 1024  # bytes of a path (UTF-8)
_MAX_NAME = 255  # bytes of one file or folder name (what Linux file systems take)
_MAX_JOB_NAME = 256  # characters of a job's display name


@dataclass(frozen=True)
class JobSpec:
    """A checked job request (its GPU choice is checked by the profiles, as a server's)."""

    options: dict  # the user_options part: profile, gpus, gpu_model, image
    notebook: str
    outputs: dict  # format -> relative path
    log: str
    parameters: dict = field(default_factory=dict)
    kernel: str | None = None
    time_limit: float | None = None
    name: str = ""

    def to_dict(self) -> dict:
        return {"options": self.options, "notebook": self.notebook, "outputs": self.outputs, "log": self.log,
                "parameters": self.parameters, "kernel": self.kernel, "time_limit": self.time_limit,
                "name": self.name}

    @classmethod
    def from_dict(cls, data: Mapping) -> JobSpec:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def requested_job_id(body: Mapping) -> str | None:
    """The ``id`` a job request asks for (checked: :data:`JOB_ID`), or None when it asks for none."""
    value = body.get("id")
    if value is None:
        return None
    if not isinstance(value, str) or not JOB_ID.fullmatch(value):
        raise OptionsError("id", "must be a UUID in lowercase hexadecimal, 32 digits or with dashes "
                                 "(or left out: the hub makes one)")
    return value


def user_path(value: Any, key: str, suffix: str | None = None) -> str:
    """A file inside the user's files, as a clean relative POSIX path; else :class:`OptionsError`."""
    if not isinstance(value, str) or not value.strip():
        raise OptionsError(key, "must be a path (a non-empty string) relative to your files")
    check_text(value, key)
    if len(value.encode()) > _MAX_PATH or "\\" in value:
        raise OptionsError(key, f"{shown(value)} is not a usable path: at most {_MAX_PATH} bytes, "
                                "folders separated by '/'")
    path = PurePosixPath(value)
    if path.is_absolute():
        raise OptionsError(key, f"{shown(value)} is outside your files: give a path relative to your home folder")
    if ".." in path.parts:
        raise OptionsError(key, f"{shown(value)} is outside your files: '..' is not allowed")
    if not path.name:
        raise OptionsError(key, f"{shown(value)} is a folder: give the path of a file")
    if any(len(part.encode()) > _MAX_NAME for part in path.parts):
        raise OptionsError(key, f"{shown(value)} has a name longer than {_MAX_NAME} bytes")
    if suffix and path.suffix != suffix:
        raise OptionsError(key, f"{shown(value)} is not a {suffix} file")
    return str(path)


def parse_job(body: Any, max_time_limit: float) -> JobSpec:
    """Check a job request; :class:`OptionsError` names the first bad field.

    The whole body is checked first (:func:`~gpuspawner.inputs.check_json`:
    finite numbers, storable text, bounded nesting), then each field. The GPU
    choice (``profile``, ``gpus``, ...) is returned unchecked in ``options``:
    the spawner's profile rules check it, exactly as for a server, before
    anything is reserved or recorded.
    """
    if not isinstance(body, Mapping):
        raise OptionsError("body", "must be a JSON object")
    check_json(body)
    unknown = [k for k in body if k not in JOB_KEYS and k not in OPTION_KEYS]
    if unknown:
        raise OptionsError(field_name(unknown[0]), f"unknown key; allowed: {', '.join(OPTION_KEYS + JOB_KEYS)}")
    if "notebook" not in body:
        raise OptionsError("notebook", "is required: the notebook to run")
    notebook = user_path(body["notebook"], "notebook", ".ipynb")
    stem = PurePosixPath(notebook).stem
    outputs_in = body.get("outputs")
    if outputs_in is None:
        outputs_in = {"ipynb": str(PurePosixPath(notebook).with_name(stem + "-output.ipynb"))}
    if not isinstance(outputs_in, Mapping) or not outputs_in:
        raise OptionsError("outputs", "must be an object {format: path}, e.g. {\"ipynb\": \"out.ipynb\"}")
    outputs = {}
    for fmt, path in outputs_in.items():
        if fmt not in OUTPUT_FORMATS:
            raise OptionsError("outputs", f"format {shown(fmt, 20)} is not offered; "
                                          f"allowed: {', '.join(OUTPUT_FORMATS)}")
        outputs[fmt] = user_path(path, f"outputs.{fmt}")
    first = PurePosixPath(next(iter(outputs.values())))
    log = user_path(body["log"], "log") if body.get("log") is not None else str(first.with_suffix(".log"))
    seen: dict[str, str] = {}
    for key, path in (("notebook", notebook), *((f"outputs.{f}", p) for f, p in outputs.items()), ("log", log)):
        if path in seen:
            raise OptionsError(key, f"{shown(path)} is also the {seen[path]}: give each file its own path")
        seen[path] = key
    parameters = body.get("parameters")
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, Mapping):
        raise OptionsError("parameters", "must be an object {name: value}")
    for name, value in parameters.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise OptionsError("parameters", f"{shown(name, 64)} is not a Python variable name")
        if isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
            continue
        if not isinstance(value, str) or len(value) > _MAX_TEXT:
            raise OptionsError(f"parameters.{field_name(name)}",
                               f"values are strings (at most {_MAX_TEXT} characters), finite numbers or booleans")
    kernel = body.get("kernel")
    if kernel is not None and (not isinstance(kernel, str) or not _KERNEL.fullmatch(kernel)):
        raise OptionsError("kernel", "must be a kernel name such as 'python3'")
    time_limit = body.get("time_limit")
    if time_limit is not None:
        if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < math.inf:
            raise OptionsError("time_limit", "must be a finite number of seconds > 0")
        if time_limit > max_time_limit:
            raise OptionsError("time_limit", f"{time_limit:g} s is more than this hub allows ({max_time_limit:g} s)")
    name = body.get("name")
    if name is None or name == "":
        name = stem[:_MAX_JOB_NAME]
    elif not isinstance(name, str) or len(name) > _MAX_JOB_NAME:
        raise OptionsError("name", f"must be a string of at most {_MAX_JOB_NAME} characters")
    requested_job_id(body)  # a bad id is refused with the rest of the body
    options = {k: body[k] for k in OPTION_KEYS if k in body}
    return JobSpec(options, notebook, outputs, log, dict(parameters), kernel,
                   float(time_limit) if time_limit is not None else None, name)
