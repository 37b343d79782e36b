"""Notebooks the job tests run, written into a user's files."""

from __future__ import annotations

from pathlib import Path

import nbformat

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def write(path: Path, *cells: str, parameters: str | None = None) -> Path:
    """A notebook with a ``parameters`` cell (if given) then ``cells``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNELSPEC
    if parameters is not None:
        nb.cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb.cells.extend(nbformat.v4.new_code_cell(c) for c in cells)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


# prints the job's GPUs as CUDA sees them (the environment) and its own pid, then sleeps `seconds`
GPU_REPORT = (
    "import os, time\n"
    "print('GPUS=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''))\n"
    "print('PID=%d' % os.getppid())\n"
    "time.sleep(seconds)\n"
    "print('slept', seconds)"
)


def outputs_text(path: Path) -> str:
    """Every stream output of an executed notebook, joined."""
    nb = nbformat.read(str(path), as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
