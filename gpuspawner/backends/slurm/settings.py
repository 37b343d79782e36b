"""A site's batchspawner settings beside gpu-slurm's GPU choices. Pure: no I/O here.

gpu-slurm is batchspawner's SlurmSpawner plus GPU profiles: a site's ``batch_script``,
``batch_submit_cmd``, ``batch_query_cmd``, ``batch_cancel_cmd``, ``exec_prefix`` and
``req_*`` settings keep working. What a user's choice decides (the job's GPUs, and the
profile's partition, time, QOS, account, reservation, CPUs, memory and node features)
is added to the site's sbatch command line (:func:`sbatch_options`), which takes
precedence over the script's ``#SBATCH`` lines, so it reaches the job whatever the
site's script says; the site's other GRES (``req_gres = "nvme:1"``) are joined with the
GPU request (:func:`join_gres`).

A setting that would fight the GPU choices is refused when the spawner is configured,
with a sentence naming it (:func:`refused_settings`): GPUs asked for by the site itself
(in ``req_gres``, ``req_ngpus``, ``req_options`` or ``#SBATCH`` lines of
``batch_script``) beside profiles that offer GPUs, another cluster (``req_cluster``),
and a ``batch_submit_cmd`` whose end is not sbatch's options.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Iterable, Mapping

from jinja2 import Template

__all__ = ["CHOICE_FLAGS", "GPU_GRES", "cluster_asks", "gpu_asks", "gpu_gres", "join_gres", "lenient_render",
           "refused_settings", "sbatch_directives", "sbatch_options", "submit_command_problem"]

#: GRES that are GPUs or shares of one (Slurm's gres/gpu, gres/shard, gres/mps)
GPU_GRES = frozenset({"gpu", "shard", "mps"})

#: batchspawner trait -> the sbatch option a profile's (or a notebook job's) value of it becomes
CHOICE_FLAGS: tuple[tuple[str, str], ...] = (
    ("req_partition", "--partition"), ("req_runtime", "--time"), ("req_qos", "--qos"),
    ("req_account", "--account"), ("req_reservation", "--reservation"), ("req_nprocs", "--cpus-per-task"),
    ("req_memory", "--mem"),
)

#: sbatch options that ask for GPUs whatever their value
_GPU_OPTIONS = ("--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket", "-G")
#: sbatch options that send the job to another cluster
_CLUSTER_OPTIONS = ("--clusters", "--cluster", "-M")
_CONTROL = re.compile(r"^[;&|<>()]+$")


def _entries(gres: str) -> list[str]:
    return [e.strip() for e in (gres or "").split(",") if e.strip()]


def gpu_gres(gres: str) -> list[str]:
    """The entries of a ``--gres`` value that are GPUs or shares of one.

    >>> gpu_gres("nvme:1,gpu:a100:2,shard:1")
    ['gpu:a100:2', 'shard:1']
    >>> gpu_gres("GRES123")
    []
    """
    return [e for e in _entries(gres) if e.split(":")[0].removeprefix("gres/").lower() in GPU_GRES]


def join_gres(site: str, gpus: str) -> str:
    """The site's own GRES and gpu-slurm's GPU request, as one ``--gres`` value.

    >>> join_gres("nvme:1", "gpu:a100:1")
    'nvme:1,gpu:a100:1'
    >>> join_gres("", "gpu:2")
    'gpu:2'
    """
    return ",".join(_entries(site) + _entries(gpus))


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: words as the shell would not read them, but still words
        return text.split()


def gpu_asks(options: str) -> list[str]:
    """The sbatch options in ``options`` (a command line's or ``#SBATCH`` lines' words) that ask for GPUs.

    >>> gpu_asks("--mem=4G --gres=gpu:1 -G 2 --gpus-per-node=1 --gres nvme:1")
    ['--gres=gpu:1', '-G 2', '--gpus-per-node=1']
    """
    words, found = _words(options), []
    for n, word in enumerate(words):
        name, equals, value = word.partition("=")
        following = words[n + 1] if n + 1 < len(words) else ""
        if name.startswith("-G") and name[2:].isdigit():  # -G2
            found.append(word)
        elif name in _GPU_OPTIONS:
            found.append(word if equals else f"{word} {following}".strip())
        elif name == "--gres" and gpu_gres(value if equals else following):
            found.append(word if equals else f"{word} {following}")
    return found


def cluster_asks(options: str) -> list[str]:
    """The sbatch options in ``options`` that send the job to another cluster (``--clusters``, ``-M``).

    >>> cluster_asks("--parsable -M other --mem=1G")
    ['-M other']
    """
    words, found = _words(options), []
    for n, word in enumerate(words):
        name, equals, _ = word.partition("=")
        if name in _CLUSTER_OPTIONS:
            found.append(word if equals else f"{word} {words[n + 1] if n + 1 < len(words) else ''}".strip())
        elif name.startswith("-M") and len(name) > 2 and not name.startswith("--"):
            found.append(word)
    return found


def sbatch_directives(script: str) -> str:
    """The options of the ``#SBATCH`` lines sbatch reads: those before the script's first command."""
    options = []
    for line in script.splitlines()[1:] if script.startswith("#!") else script.splitlines():
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            options.append(stripped[len("#SBATCH"):])
        elif stripped and not stripped.startswith("#"):
            break
    return " ".join(options)


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return ""


def lenient_render(template: str, values: Mapping[str, str]) -> str:
    """``template`` filled in as batchspawner fills it (jinja2 where it has ``{{``/``{%``, else
    ``str.format``), every name it uses that ``values`` lacks blank."""
    if "{{" in template or "{%" in template:
        return Template(template).render(**values)
    return string.Formatter().vformat(template, (), _Blank(values))


def submit_command_problem(command: str) -> str | None:
    """Why gpu-slurm cannot add sbatch options at the end of ``command`` (a filled-in batch_submit_cmd), or None.

    >>> submit_command_problem("sbatch --parsable") is None
    True
    >>> submit_command_problem("sbatch --parsable | tail -n 1")
    "'|' follows sbatch's options"
    """
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError as e:
        return f"it is not a command line the shell can read ({e})"
    sbatch = [n for n, w in enumerate(words) if w.rsplit("/", 1)[-1] == "sbatch"]
    if not sbatch:
        return "it runs no sbatch"
    after = next((w for w in words[sbatch[-1] + 1:] if _CONTROL.match(w)), None)
    return f"{after!r} follows sbatch's options" if after else None


def sbatch_options(identity: Iterable[str], chosen: Mapping[str, str], configured: Mapping[str, str],
                   gres: str, constraint: str) -> list[str]:
    """The options gpu-slurm adds to the site's sbatch command line for one job.

    ``identity``: ``--nodes=1``, the job's name and comment; ``chosen``/``configured``: the
    ``CHOICE_FLAGS`` traits now and as configured (only values the choice changed are
    added); ``gres``: the whole ``--gres`` value when the job has GPUs; ``constraint``:
    the node features the choice asks for.

    >>> sbatch_options(["--nodes=1"], {"req_partition": "gpu", "req_memory": "4G"},
    ...                {"req_partition": "batch", "req_memory": "4G"}, "gpu:a100:1", "")
    ['--nodes=1', '--partition=gpu', '--gres=gpu:a100:1']
    """
    options = list(identity)
    for trait, flag in CHOICE_FLAGS:
        value = chosen.get(trait, "")
        if value and value != configured.get(trait, ""):
            options.append(f"{flag}={value}")
    if gres:
        options.append(f"--gres={gres}")
    if constraint:
        options.append(f"--constraint={constraint}")
    return options


def refused_settings(settings: Mapping[str, str], script_directives: str, submit_command: str,
                     offers_gpus: bool) -> list[str]:
    """Sentences, each naming a configured batchspawner setting gpu-slurm cannot honour beside its choices.

    ``settings``: the configured ``req_*`` values; ``script_directives``: the ``#SBATCH``
    options of ``batch_script`` filled in with every ``req_*`` blank (what the script asks
    for by itself); ``submit_command``: ``batch_submit_cmd`` filled in; ``offers_gpus``:
    whether some profile offers GPUs (else the site's GPU settings are honoured as they are).
    """
    found = []
    problem = submit_command_problem(submit_command)
    if problem:
        found.append(f"batch_submit_cmd = {submit_command!r}: gpu-slurm adds each job's options (its GPUs, the "
                     f"profile's partition and limits, the job's name and comment) at its end, but {problem}. "
                     "Make it end with sbatch and its options (batchspawner's default is 'sbatch --parsable')")
    if not offers_gpus:
        return found
    why = "beside GPU profiles, which choose each server's GPUs and ask Slurm for them on sbatch's command line"
    gres = gpu_gres(settings.get("req_gres", ""))
    if gres:
        found.append(f"req_gres = {settings['req_gres']!r} asks Slurm for GPUs for every server ({', '.join(gres)}) "
                     f"{why}. Remove {', '.join(gres)} from it (other GRES in req_gres are kept and joined with "
                     "each server's GPU request)")
    if settings.get("req_ngpus"):
        found.append(f"req_ngpus = {settings['req_ngpus']!r} asks for GPUs for every server {why}. Remove it")
    asked = gpu_asks(settings.get("req_options", ""))
    if asked:
        found.append(f"req_options = {settings['req_options']!r} asks Slurm for GPUs for every server "
                     f"({' '.join(asked)}) {why}. Remove {' '.join(asked)} from it")
    asked = gpu_asks(script_directives)
    if asked:
        found.append(f"batch_script asks Slurm for GPUs for every server (#SBATCH {' '.join(asked)}) {why}. "
                     "Remove those lines, or use {gres} there (gpu-slurm fills it in with each server's GPUs)")
    elsewhere = [f"req_cluster = {settings['req_cluster']!r}"] if settings.get("req_cluster") else []
    elsewhere += [f"{name} ({' '.join(asked)})" for name, text in (
        ("batch_submit_cmd", submit_command), ("req_options", settings.get("req_options", "")),
        ("batch_script", script_directives)) if (asked := cluster_asks(text))]
    for setting in elsewhere:
        found.append(f"{setting} sends jobs to another cluster, but gpu-slurm reads the nodes and jobs of the "
                     "cluster its Slurm commands reach (sinfo, squeue), so their GPUs would be neither shown nor "
                     "counted. Point SLURM_CONF (or exec_prefix) at that cluster instead")
    return found
