"""A private one-node Slurm cluster with typed GPUs: for the runnable default and the tests.

Everything lives under one directory: a munged with its own key and socket,
slurm.conf and gres.conf, state, spool, logs, pid files, and the GPU device
files (``mknod ... c 195 N``, as NVIDIA's driver makes them), whose minor
numbers are the stand-in NVML's simulated GPUs (``gpuspawner.simulation``).
Ports are free loopback ports. :meth:`SlurmCluster.stop` stops the daemons by
the pids in their pid files. Needs root (slurmd runs jobs, mknod makes device
files).

``jupyterhub_config.py`` with ``GPUSPAWNER_BACKEND=slurm`` starts one when no
site cluster answers, and stops it when the hub exits; a watcher process
(``python -m gpuspawner.backends.slurm.dev watch HUB_PID DIR``) stops it when the
hub dies without exiting (SIGKILL), so its daemons never outlive the hub.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ...ports import free_port
from ..local.fence import DEVICES_MOUNT

#: The programs the cluster needs (Debian packages slurm-wlm and munge; scripts/setup installs them).
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
#: The daemons, by the pid files :meth:`SlurmCluster.stop` reads (relative to the cluster's directory).
DAEMONS = (("slurmd", "slurmd.pid"), ("slurmctld", "slurmctld.pid"), ("munged", "munge/munged.pid"))


def absent_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not os.access(f"/usr/sbin/{p}", os.X_OK)]


def cannot_start() -> str | None:
    """Why a private cluster cannot run on this host (None: it can)."""
    absent = absent_programs()
    if absent:
        return (f"Slurm and munge are not installed ({', '.join(absent)} absent; "
                "scripts/setup installs slurm-wlm and munge)")
    if os.geteuid() != 0:
        return "the private Slurm cluster needs root (slurmd runs the jobs; device files are made with mknod)"
    return None


def devices_constrainable() -> bool:
    """Whether Slurm's ConstrainDevices can work here: the cgroup v1 devices controller is mounted."""
    return (DEVICES_MOUNT / "devices.deny").exists()


def cluster_answers(env: dict[str, str] | None = None, timeout: float = 20) -> bool:
    """Whether a Slurm controller answers ``sinfo`` (with ``SLURM_CONF`` from ``env``, or Slurm's default)."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], env=env, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


SLURM_CONF = """\
ClusterName=gpuspawner
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={spool}
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ProctrackType={proctrack}
TaskPlugin={task}
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
FirstJobId={first_job}
SlurmdParameters=config_overrides
KillWait=2
MinJobAge=30
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=8000 Gres={gres} State=UNKNOWN
PartitionName={partition} Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""

#: with ``constrain_devices``: the job's devices cgroup (cgroup v1 here) allows only its GPUs'
#: device files, and Slurm then sets CUDA_VISIBLE_DEVICES relative to them (0..n-1)
CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainDevices=yes
"""


class SlurmCluster:
    """One slurmctld and one slurmd (with munged) under ``directory``."""

    def __init__(self, directory: Path, gpus: dict[str, int] | None = None, cpus: int = 8,
                 partition: str = "gpu", constrain_devices: bool = False) -> None:
        self.dir = Path(directory)
        self.gpus = dict(gpus or {"a100": 2, "t4": 2})
        self.cpus = cpus
        self.partition = partition
        self.constrain_devices = constrain_devices
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._munged_pid: int | None = None

    @property
    def spool(self) -> Path:
        """slurmd's spool folder, where each job step's Unix socket lives (``<spool>/<host>_<job>.<step>``):
        a short path of its own under /tmp (named after the cluster's folder, so another process that
        knows only that folder finds it), as a socket's path may not pass 107 characters."""
        return Path("/tmp") / f"gpuspawner-slurmd-{hashlib.sha256(str(self.dir.resolve()).encode()).hexdigest()[:12]}"

    def device_nodes(self) -> list[Path]:
        """The GPUs' device files in gres.conf's order (``nvidia0``, ``nvidia1``, ...: minor = position)."""
        return [self.dir / "dev" / f"nvidia{i}" for i in range(sum(self.gpus.values()))]

    def models(self) -> list[str]:
        """The GRES type of each GPU, in gres.conf's order."""
        return [model for model, n in self.gpus.items() for _ in range(n)]

    @property
    def gres(self) -> str:
        return ",".join(f"gpu:{model}:{n}" for model, n in self.gpus.items())

    def _write(self) -> None:
        d = self.dir
        shutil.rmtree(d / "state", ignore_errors=True)  # a private cluster starts with no jobs
        for sub in ("munge", "state", "dev"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(mode=0o755, parents=True, exist_ok=True)
        # users who submit jobs (accounts the hub makes) reach munged's socket here, never its key (0400)
        (d / "munge").chmod(0o711)
        key = d / "munge" / "munge.key"
        key.unlink(missing_ok=True)
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as out:
            out.write(os.urandom(1024))
        gres_lines = []
        index = 0
        for model, n in self.gpus.items():
            first = index
            for _ in range(n):
                node = d / "dev" / f"nvidia{index}"
                if not node.exists():
                    os.mknod(node, 0o666 | 0o020000, os.makedev(195, index))
                node.chmod(0o666)  # whatever the umask: jobs run as other users (ConstrainDevices decides)
                index += 1
            files = f"{d}/dev/nvidia[{first}-{index - 1}]" if n > 1 else f"{d}/dev/nvidia{first}"
            gres_lines.append(f"Name=gpu Type={model} File={files}\n")
        (d / "gres.conf").write_text("".join(gres_lines))
        if self.constrain_devices:
            (d / "cgroup.conf").write_text(CGROUP_CONF)
        else:
            (d / "cgroup.conf").unlink(missing_ok=True)
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, dir=d, spool=self.spool, ctld_port=free_port(), slurmd_port=free_port(),
            cpus=self.cpus, gres=self.gres, partition=self.partition,
            proctrack="proctrack/cgroup" if self.constrain_devices else "proctrack/linuxproc",
            task="task/cgroup" if self.constrain_devices else "task/none",
            # Slurm's cgroups are named after node and job (slurm_HOST/uid_0/job_N): start job ids
            # at a random number so clusters of concurrent test sessions do not share them
            first_job=int.from_bytes(os.urandom(3), "big") % 9_000_000 + 1_000_000,
        ))

    def start(self, timeout: float = 60) -> None:
        self._write()
        d = self.dir
        subprocess.run(
            [_program("munged"), f"--socket={d}/munge/munge.socket", f"--key-file={d}/munge/munge.key",
             f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log",
             f"--seed-file={d}/munge/munged.seed", "--force"],
            check=True, env=self.env, capture_output=True,
        )
        self._munged_pid = int((d / "munge" / "munged.pid").read_text())
        subprocess.run([_program("slurmctld"), "-i"], check=True, env=self.env, capture_output=True)
        subprocess.run([_program("slurmd")], check=True, env=self.env, capture_output=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            if out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise TimeoutError(f"the Slurm node did not come up within {timeout}s:\n{self.logs()}")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster (``SLURM_CONF`` set)."""
        return subprocess.run(args, env=self.env, capture_output=True, text=True, check=check, timeout=30)

    def jobs(self) -> list[str]:
        """``"ID STATE REASON NAME"`` for every job Slurm still lists."""
        out = self.run("squeue", "-h", "-o", "%i %T %r %j").stdout
        return [line for line in out.splitlines() if line.strip()]

    def cancel_all(self) -> None:
        self.run("scancel", "--full", "--partition", self.partition, check=False)
        for line in self.jobs():
            self.run("scancel", line.split()[0], check=False)

    def unreachable_conf(self, directory: Path) -> Path:
        """A copy of this cluster's slurm.conf whose slurmctld port nobody listens on (a controller that
        is down; clients give up after about a second), for the Slurm commands of "Slurm does not answer"."""
        text = re.sub(r"(?m)^SlurmctldPort=.*$", f"SlurmctldPort={free_port()}", self.conf.read_text())
        path = Path(directory) / "slurm.conf"
        path.write_text(text + "MessageTimeout=2\n")
        shutil.copy(self.dir / "gres.conf", Path(directory) / "gres.conf")
        return path

    def logs(self) -> str:
        text = ""
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.dir / name
            if path.exists():
                text += f"--- {name}\n" + path.read_text(errors="replace")[-3000:]
        return text

    def daemon_pids(self) -> dict[str, int]:
        """program -> pid of each of this cluster's daemons that is alive (by its pid file, and the
        process at that pid is that program: a stale pid file names nobody)."""
        alive = {}
        for program, pid_file in DAEMONS:
            try:
                pid = int((self.dir / pid_file).read_text().strip())
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except (OSError, ValueError):
                continue
            if os.path.basename(command.decode(errors="replace")) == program:
                alive[program] = pid
        return alive

    def stop(self) -> None:
        """Cancel the jobs left (so no slurmstepd outlives slurmd), then stop slurmd, slurmctld and
        munged by the pids in their pid files. Safe to call twice, and from another process that
        knows only the directory."""
        pids = self.daemon_pids()
        if "slurmctld" in pids:
            try:
                self.cancel_all()
                deadline = time.monotonic() + 15
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.3)
            except (OSError, subprocess.SubprocessError):
                pass  # the controller does not answer: nothing to cancel through it
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for pid in pids.values():
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for _, pid_file in DAEMONS:
            (self.dir / pid_file).unlink(missing_ok=True)
        shutil.rmtree(self.spool, ignore_errors=True)
        if (self.dir / "cgroup.conf").exists():
            self._remove_empty_cgroups()

    def _remove_empty_cgroups(self) -> None:
        """Slurm's cgroup folders (``slurm_HOST/uid_N/job_N/...`` per controller) that no process uses
        any more; ones another cluster's jobs still use refuse rmdir and stay."""
        for top in Path("/sys/fs/cgroup").glob(f"*/slurm_{self.host}"):
            for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
                try:
                    folder.rmdir()
                except OSError:
                    pass


def start_for_this_process(directory: Path) -> SlurmCluster:
    """Start a private cluster under ``directory`` (a100:2,t4:2; ConstrainDevices where the host
    allows it) for this process: its Slurm commands and children use it (``SLURM_CONF``), and it is
    stopped when this process exits, or by a watcher when it dies without exiting."""
    why = cannot_start()
    if why:
        raise RuntimeError(why)
    cluster = SlurmCluster(directory, constrain_devices=devices_constrainable())
    cluster.dir.mkdir(parents=True, exist_ok=True)
    cluster.stop()  # one a previous process left running here (its watcher was stopped first)
    start_watcher(cluster.dir)
    atexit.register(cluster.stop)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    os.environ["SLURM_CONF"] = str(cluster.conf)
    return cluster


def watch(hub_pid: int, directory: Path, period: float = 0.5) -> None:
    """Stop the cluster under ``directory`` once process ``hub_pid`` is gone (however it ended)."""
    while True:
        try:
            os.kill(hub_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(period)
    SlurmCluster(directory).stop()


def start_watcher(directory: Path) -> int:
    """A process that stops the cluster under ``directory`` when this process ends; its pid."""
    log = open(Path(directory) / "watcher.log", "ab")  # the child keeps it
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuspawner.backends.slurm.dev", "watch", str(os.getpid()), str(directory)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # not stopped by the terminal's Ctrl-C before the hub has stopped
    )
    log.close()
    return proc.pid


def main(argv: list[str]) -> int:
    usage = "usage: python -m gpuspawner.backends.slurm.dev start DIR | stop DIR | watch PID DIR"
    if argv[:1] == ["start"] and len(argv) == 2:
        why = cannot_start()
        if why:
            print(why, file=sys.stderr)
            return 1
        cluster = SlurmCluster(Path(argv[1]), constrain_devices=devices_constrainable())
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    if argv[:1] == ["stop"] and len(argv) == 2:
        SlurmCluster(Path(argv[1])).stop()
        return 0
    if argv[:1] == ["watch"] and len(argv) == 3:
        watch(int(argv[1]), Path(argv[2]))
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
