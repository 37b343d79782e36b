"""What runs inside a notebook GPU job: ``python -m gpuspawner.jobs.execute`` (this module, by its public name).

It runs one notebook headless with nbclient, in the user's files (its working
directory), on the GPUs its environment names, and writes:

- the executed notebook, with its outputs, to every ``--output FORMAT=PATH``
  (``ipynb``, ``html``), also when a cell fails or the job is stopped;
- one line per cell to standard output (the hub sends it to the job's log);
- ``--status PATH``: ``{"outcome": "completed" | "failed" | "stopped", "error": ...}``,
  which the hub reads when the job's process (or container) has ended, even
  after a hub restart;
- ``--termination-log PATH`` (a Kubernetes container's ``/dev/termination-log``,
  written only where it exists): the error in one line, or ``completed``, which
  the pod's status shows the hub (it cannot read the user's volume).

Parameters (``--parameters JSON``) go in a new cell after the cell tagged
``parameters`` (as papermill does), or first if there is none. Exit status:
0 completed, 1 failed, 2 bad arguments or notebook, 143 stopped (SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import nbformat

STOPPED_EXIT = 143
TERMINATION_MAX = 4096  # Kubernetes keeps at most this many bytes of a termination message


class Stopped(Exception):
    """The hub asked the job to stop (SIGTERM: cancel or time limit)."""


def inject_parameters(nb: nbformat.NotebookNode, parameters: dict) -> None:
    """Add a cell setting ``parameters`` after the ``parameters``-tagged cell (else first)."""
    if not parameters:
        return
    source = "# Parameters\n" + "".join(f"{name} = {value!r}\n" for name, value in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    where = next((i + 1 for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), 0)
    nb.cells.insert(where, cell)


def _write_outputs(nb: nbformat.NotebookNode, outputs: dict[str, str]) -> None:
    for fmt, path in outputs.items():
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "ipynb":
            nbformat.write(nb, str(target))
        else:
            import nbconvert

            body, _resources = nbconvert.get_exporter(fmt)().from_notebook_node(nb)
            target.write_text(body, encoding="utf-8")


def _write_status(path: str | None, outcome: str, error: str | None) -> None:
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"outcome": outcome, "error": error, "finished": time.time()}))
    os.replace(tmp, target)


def _write_termination_log(path: str | None, outcome: str, error: str | None) -> None:
    if not path or not os.path.exists(path):
        return
    try:
        Path(path).write_text((error or outcome)[:TERMINATION_MAX])
    except OSError:
        pass  # the exit status still tells the outcome


def run(notebook: str, outputs: dict[str, str], parameters: dict, kernel: str | None, status: str | None,
        termination_log: str | None = None) -> int:
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    try:
        nb = nbformat.read(notebook, as_version=4)
    except FileNotFoundError:
        message = f"notebook not found: {notebook}"
        print(message, flush=True)
        _write_status(status, "failed", message)
        _write_termination_log(termination_log, "failed", message)
        return 2
    except Exception as e:  # not JSON, not a notebook
        message = f"{notebook} is not a readable notebook: {e}"
        print(message, flush=True)
        _write_status(status, "failed", message)
        _write_termination_log(termination_log, "failed", message)
        return 2
    inject_parameters(nb, parameters)
    kernel_name = kernel or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    cwd = str(Path(notebook).resolve().parent)
    # the outputs are in the notebook once the last cell ran: end the kernel at once, so the GPUs come back sooner
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=None, resources={"metadata": {"path": cwd}},
                            shutdown_kernel="immediate")
    code_cells = sum(1 for c in nb.cells if c.cell_type == "code")

    def on_term(_signum, _frame):
        raise Stopped()

    signal.signal(signal.SIGTERM, on_term)
    outcome, error, code = "completed", None, 0
    print(f"running {notebook} ({code_cells} code cells) on kernel {kernel_name}; "
          f"GPUs: {os.environ.get('CUDA_VISIBLE_DEVICES') or 'none'}", flush=True)
    done = 0

    async def on_cell_executed(cell, cell_index, execute_reply):  # nbclient hook
        nonlocal done
        if cell.cell_type == "code":
            done += 1
            print(f"cell {done}/{code_cells} ran", flush=True)

    client.on_cell_executed = on_cell_executed
    try:
        client.execute()
    except CellExecutionError as e:
        outcome, code = "failed", 1
        error = f"{e.ename}: {e.evalue}" if getattr(e, "ename", None) else str(e).strip().splitlines()[-1]
    except Stopped:
        outcome, error, code = "stopped", "stopped by the hub", STOPPED_EXIT
    except Exception as e:
        outcome, error, code = "failed", f"{type(e).__name__}: {e}", 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            _write_outputs(nb, outputs)
        except Exception as e:  # the outcome still says what happened
            print(f"could not write the output: {e}", flush=True)
    print(f"{outcome}" + (f": {error}" if error else ""), flush=True)
    _write_status(status, outcome, error)
    _write_termination_log(termination_log, outcome, error)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuspawner.jobs.execute", description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebook", required=True)
    parser.add_argument("--output", action="append", default=[], metavar="FORMAT=PATH")
    parser.add_argument("--parameters", default="{}", help="JSON object")
    parser.add_argument("--kernel")
    parser.add_argument("--status")
    parser.add_argument("--log", help="append standard output and error to this file")
    parser.add_argument("--termination-log", help="write the error (or 'completed') here if this file exists")
    args = parser.parse_args(argv)
    if args.log:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
    outputs = dict(item.split("=", 1) for item in args.output)
    return run(args.notebook, outputs, json.loads(args.parameters), args.kernel, args.status, args.termination_log)


if __name__ == "__main__":
    sys.exit(main())
