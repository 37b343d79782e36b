"""A private one-node Slurm cluster with typed GPUs, for the tests (and scripts that want one).

Everything lives under one directory: a munged with its own key and socket,
slurm.conf and gres.conf, state, spool, logs, pid files, and the GPU device
files (``mknod ... c 195 N``, as NVIDIA's driver makes them). Ports are free
loopback ports. :meth:`SlurmCluster.stop` stops the daemons by the pids in
their pid files. Needs root (slurmd runs jobs, mknod makes device files).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: The programs the cluster needs (Debian packages slurm-wlm and munge; scripts/setup installs them).
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


def absent_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not os.access(f"/usr/sbin/{p}", os.X_OK)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


SLURM_CONF = """\
ClusterName=gpuspawner-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
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
        for sub in ("munge", "state", "spool", "dev"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        gres_lines = []
        index = 0
        for model, n in self.gpus.items():
            first = index
            for _ in range(n):
                node = d / "dev" / f"nvidia{index}"
                if not node.exists():
                    os.mknod(node, 0o666 | 0o020000, os.makedev(195, index))
                index += 1
            files = f"{d}/dev/nvidia[{first}-{index - 1}]" if n > 1 else f"{d}/dev/nvidia{first}"
            gres_lines.append(f"Name=gpu Type={model} File={files}\n")
        (d / "gres.conf").write_text("".join(gres_lines))
        if self.constrain_devices:
            (d / "cgroup.conf").write_text(CGROUP_CONF)
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, dir=d, ctld_port=_free_port(), slurmd_port=_free_port(),
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
        text = re.sub(r"(?m)^SlurmctldPort=.*$", f"SlurmctldPort={_free_port()}", self.conf.read_text())
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

    def stop(self) -> None:
        """Cancel the jobs left (so no slurmstepd outlives slurmd), then stop slurmd, slurmctld and
        munged by the pids in their pid files."""
        if (self.dir / "slurmctld.pid").exists():
            try:
                self.cancel_all()
                deadline = time.monotonic() + 15
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.3)
            except (OSError, subprocess.SubprocessError):
                pass  # the controller is gone already: nothing to cancel through it
        pids = []
        for pid_file in (self.dir / "slurmd.pid", self.dir / "slurmctld.pid", self.dir / "munge" / "munged.pid"):
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for pid in pids:
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
        if self.constrain_devices:
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
