"""Answers under a spawn storm: ``scripts/bench storm [--backend local|docker]``.

Starts the runnable default (``jupyterhub_config.py``, loaded as a subconfig) on
free loopback ports with a private state folder and database, simulated GPUs
through the stand-in NVML (``--a100``/``--t4``, default 2 + 2) and a service
token with admin scopes. It creates ``--users`` users and fires ``--requests``
spawn requests at once (``POST /hub/api/users/NAME/servers/sN``, one thread per
request, each bounded by ``--timeout``), with user_options of 1 or 2 GPUs of
model A100 (slug a100-sxm4-80gb), T4 or any (a fixed mix from ``--seed``). Then it prints figures
only (asserts nothing about timing):

- answer time p50/p99/max: from sending the POST to its HTTP status, overall
  and per status, and the status mix (201/202/409/other). JupyterHub answers
  202 when a spawn has not finished ``slow_spawn_timeout`` (10 s) after its
  handler began it, so a 202 comes a little after 10 s by design; a 409 or
  201 after 10 s means the hub was too busy to answer;
- placement decision p50/p99/max from the hub's log: from sending the POST to
  the log line "Reserved ..." or "Refused: ..." of that server (the hub logs
  with millisecond timestamps on this machine's clock), and how many decisions
  came after ``slow_spawn_timeout`` (a refusal then reaches the user on the
  progress page instead of as a 409);
- placement p50/p99 from the hub's Prometheus histogram
  ``gpuspawner_placement_seconds`` at ``/hub/metrics`` (upper bounds of its
  buckets): it measures only the spawner's own placement step, from asking the
  ledger for GPUs to getting them or being refused;
- the hub process's CPU time until the last answer, and the machine's load
  average before the storm (other work on the machine slows every figure);
- the hub's REST latency (``GET /hub/api/``, every 50 ms) during the storm: a
  long one means the event loop was blocked;
- servers started vs refused, once every 202 has settled (ready or gone);
- double allocations: GPU UUIDs held by two live servers (gpu-local: each
  server process's ``CUDA_VISIBLE_DEVICES`` from ``/proc/PID/environ``;
  gpu-docker: each running container's GPU labels, DeviceRequests and
  ``NVIDIA_VISIBLE_DEVICES`` from its ``/proc/1/environ``). Must be 0.

``--profile FILE`` records the hub with py-spy (``pip install py-spy``) during
the storm, as collapsed stacks (``--format raw``).

``--backend docker`` starts a private dockerd with the stand-in NVIDIA hook
(tests/docker/engine.py) and builds or loads the single-user image
(images/build.py, cached under build/images); it needs root, docker.io and
mmdebstrap. Everything started here (hub, proxy, services, servers, dockerd)
is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import requests

import fakenvml
from gpuspawner.backends.docker.objects import allocation_from_labels
from gpuspawner.simulation import simulated_config
from hub import Hub, free_port, pid_alive, process_env

ROOT = Path(__file__).resolve().parent.parent
SLOW_SPAWN_TIMEOUT = 10.0  # JupyterHub's default, which the runnable default keeps

# The runnable default, plus a service whose token creates users and spawns on their behalf.
WRAPPER_CONFIG = """
import json, os
settings = json.loads(os.environ["GPUSPAWNER_TEST_HUB"])
load_subconfig(settings["default_config"])
c = get_config()
c.JupyterHub.services.append({"name": "storm", "api_token": settings["token"]})
c.JupyterHub.load_roles.append({
    "name": "storm",
    "scopes": ["admin:users", "admin:servers", "admin:server_state", "list:users", "read:users",
               "read:metrics"],
    "services": ["storm"],
})
"""

LOG_LINE = re.compile(
    r"^\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) [^\]]*\] (\S+?): (Placing|Reserved|Refused)(.*)$"
)


@dataclass
class Request:
    user: str
    server: str
    body: dict
    sent: float = 0.0  # time.time() when the POST was sent
    answer: float | None = None  # seconds until its HTTP status
    status: int | str = "none"
    message: str = ""
    outcome: str = ""  # started / refused / failed
    placing: float | None = None  # seconds from sending to the spawner's "Placing" log line
    decision: float | None = None  # ... to its "Reserved" or "Refused" line
    decided: str = ""


@dataclass
class Storm:
    requests: list[Request]
    wall: float  # seconds until every 202 settled
    answered: float  # seconds until the last answer
    hub_cpu: float  # CPU seconds the hub process used until the last answer
    pings: list[float] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def figures(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    if not values:
        return "none"
    v = [x * scale for x in values]
    return (f"p50 {percentile(v, 50):.3f} {unit}, p99 {percentile(v, 99):.3f} {unit}, "
            f"max {max(v):.3f} {unit} ({len(v)})")


def plan(users: int, count: int, seed: int) -> list[Request]:
    """``count`` requests spread over ``users`` users (servers s1, s2, ...), 1 or 2 GPUs of a100/t4/any."""
    rng = random.Random(seed)
    names = [f"storm{n:03d}" for n in range(users)]
    result = []
    for n in range(count):
        user = names[n % users]
        body = {"profile": "gpu", "gpus": rng.choice([1, 2]), "gpu_model": rng.choice(["a100-sxm4-80gb", "t4", "any"])}
        result.append(Request(user, f"s{n // users + 1}", body))
    return result


# ------------------------------------------------------------ the hub


class StormHub(Hub):
    """The runnable default on free loopback ports, in a private state folder."""

    def __init__(
        self, directory: Path, backend: str, a100: int, t4: int, engine=None, image: str = "", extra_config: str = "",
    ) -> None:
        directory = Path(directory)
        config = directory / "storm_config.py"
        super().__init__(directory, {}, config_file=config)
        config.write_text(WRAPPER_CONFIG + extra_config)
        state = self.dir / "state"
        state.mkdir(parents=True, exist_ok=True)
        gpus = simulated_config(a100=a100, t4=t4)
        # the runnable default keeps an existing device file: this one says how many GPUs it simulates
        (state / "simulated-gpus.json").write_text(json.dumps(gpus, indent=2))
        self.settings["default_config"] = str(ROOT / "jupyterhub_config.py")
        self.env.update({
            "GPUSPAWNER_TEST_HUB": json.dumps(self.settings),
            "GPUSPAWNER_STATE_DIR": str(state),
            "GPUSPAWNER_FAKENVML_DIR": str(fakenvml.build(ROOT / "build" / "fakenvml")),
            "GPUSPAWNER_BIND_URL": self.url,
            "GPUSPAWNER_HUB_BIND_URL": self.settings["hub_bind_url"],
            "GPUSPAWNER_PROXY_API_URL": self.settings["proxy_api_url"],
            "GPUSPAWNER_BACKEND": backend,
            # gpu-local's accounts (jupyter-<name> by default): this run's own, deleted by close()
            "GPUSPAWNER_ACCOUNT_PREFIX": self.settings["account_prefix"],
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        })
        self.headers = {"Authorization": f"token {self.token}"}
        self.engine = engine
        if engine is not None:
            fakenvml.write_config(engine.gpus_path, gpus)  # the stand-in hook checks device requests against it
            self.env.update({
                **engine.env(),
                "GPUSPAWNER_DOCKER_NETWORK": engine.network,
                "GPUSPAWNER_HUB_PORT": str(free_port()),
                "GPUSPAWNER_IMAGE": image,
                "GPUSPAWNER_DEVICE_REQUESTS": "1",
            })
        # the runnable default writes its proxy pid file into its state folder
        self.proxy_pid_file = state / "proxy.pid"

    def descendants(self) -> set[int]:
        """Every process below the hub (proxy, services, servers), read from /proc."""
        if self.proc is None:
            return set()
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        found, frontier = set(), {self.proc.pid}
        while frontier:
            frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
            found |= frontier
        return found

    def _stop_proxy(self) -> None:
        if self.proxy_pid_file.exists():
            pid = int(self.proxy_pid_file.read_text().strip() or 0)
            if pid and pid_alive(pid) and b"configurable-http-proxy" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)

    def servers(self) -> dict[tuple[str, str], dict]:
        """(user, server name) -> the server's model, state included."""
        r = self.api("GET", "/users", params={"include_stopped_servers": "0"})
        r.raise_for_status()
        return {(u["name"], name): s for u in r.json() for name, s in (u.get("servers") or {}).items()}

    def close(self) -> None:
        """Stop every server, the hub, and whatever of theirs is left, all by pid."""
        left = self.descendants()
        if self.proc is not None and self.proc.poll() is None:
            try:
                for (user, name), server in self.servers().items():
                    if pid := (server.get("state") or {}).get("pid"):
                        self.server_pids.add(pid)
                    self.api("DELETE", f"/users/{user}/servers/{name}")
            except requests.RequestException:
                pass
            left |= self.descendants()
        self.stop()
        deadline = time.monotonic() + 10
        for pid in left | self.server_pids:
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.delete_accounts()


# ------------------------------------------------------------ the storm


def fire(hub: StormHub, planned: list[Request], timeout: float, settle: float) -> Storm:
    """Send every request at once; then wait until each 202 is ready or gone."""
    barrier = threading.Barrier(len(planned) + 1)
    done = threading.Event()
    pings: list[float] = []

    def send(req: Request) -> None:
        barrier.wait()
        req.sent = time.time()
        t0 = time.perf_counter()
        try:
            r = requests.post(f"{hub.url}/hub/api/users/{req.user}/servers/{req.server}", json=req.body,
                              headers=hub.headers, timeout=timeout)
            req.status = r.status_code
            if r.status_code >= 400:
                try:
                    req.message = r.json().get("message", r.text)
                except ValueError:
                    req.message = r.text
        except requests.RequestException as e:
            req.status = type(e).__name__
        req.answer = time.perf_counter() - t0

    def ping() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                requests.get(hub.url + "/hub/api/", timeout=timeout)
                pings.append(time.perf_counter() - t0)
            except requests.RequestException:
                pass
            done.wait(0.05)

    threads = [threading.Thread(target=send, args=(r,), daemon=True) for r in planned]
    pinger = threading.Thread(target=ping, daemon=True)
    for t in threads:
        t.start()
    pinger.start()
    cpu0 = cpu_seconds(hub.proc.pid)
    t0 = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join(timeout + 5)
    answered = time.perf_counter() - t0
    hub_cpu = cpu_seconds(hub.proc.pid) - cpu0
    done.set()
    pinger.join()

    # 202: the spawn goes on after the answer; wait until each is ready or gone
    deadline = time.monotonic() + settle
    for req in planned:
        if req.status == 409:
            req.outcome = "refused"
        elif req.status not in (201, 202):
            req.outcome = "failed"
    while time.monotonic() < deadline and any(not r.outcome for r in planned):
        servers = hub.servers()
        for req in planned:
            if req.outcome:
                continue
            server = servers.get((req.user, req.server))
            if server is None:
                req.outcome = "gone"  # refused or failed after the answer: read_decisions tells which
            elif server.get("ready"):
                req.outcome = "started"
        time.sleep(0.5)
    for req in planned:
        req.outcome = req.outcome or "still pending"
    return Storm(planned, time.perf_counter() - t0, answered, hub_cpu, pings)


def read_decisions(hub: StormHub, planned: list[Request]) -> None:
    """Fill in each request's placing/decision times from the hub's log."""
    by_name = {f"{r.user}:{r.server}": r for r in planned}
    for line in hub.log_path.read_text(errors="replace").splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        m = LOG_LINE.match(line)
        if not m or m.group(2) not in by_name:
            continue
        req = by_name[m.group(2)]
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp() - req.sent
        if m.group(3) == "Placing":
            req.placing = at
        else:
            req.decision, req.decided = at, m.group(3)
    for req in planned:
        if req.outcome == "gone":  # the progress page showed the refusal, or why the start failed
            req.outcome = "refused late" if req.decided == "Refused" else "failed after a 202"


def placement_histogram(hub: StormHub) -> dict[str, list[tuple[float, float]]]:
    """outcome -> cumulative (upper bound, count) of gpuspawner_placement_seconds."""
    text = requests.get(hub.url + "/hub/metrics", headers=hub.headers, timeout=60).text
    buckets: dict[str, list[tuple[float, float]]] = {}
    pattern = r'^gpuspawner_placement_seconds_bucket\{le="([^"]+)",outcome="(\w+)"\} (\S+)$'
    for m in re.finditer(pattern, text, re.MULTILINE):
        buckets.setdefault(m.group(2), []).append((float(m.group(1)), float(m.group(3))))
    return buckets


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    total = buckets[-1][1]
    for bound, count in buckets:
        if count >= q * total:
            return bound
    return float("inf")


def holders_local(hub: StormHub) -> dict[str, list[str]]:
    """UUID -> live servers whose process has it in CUDA_VISIBLE_DEVICES."""
    held: dict[str, list[str]] = {}
    for (user, name), server in hub.servers().items():
        pid = (server.get("state") or {}).get("pid")
        if not pid or not pid_alive(pid):
            continue
        hub.server_pids.add(pid)
        for uuid in filter(None, process_env(pid).get("CUDA_VISIBLE_DEVICES", "").split(",")):
            held.setdefault(uuid, []).append(f"{user}:{name}")
    return held


def holders_docker(hub: StormHub) -> dict[str, list[str]]:
    """UUID -> running containers that hold it (labels, DeviceRequests or NVIDIA_VISIBLE_DEVICES)."""
    from engine import visible_devices  # tests/docker/engine.py

    held: dict[str, list[str]] = {}
    for c in hub.engine.containers():
        c.reload()
        if c.status != "running":
            continue
        allocation = allocation_from_labels(c.labels)
        labelled = set(allocation.uuids) if allocation else set()
        requested = {u for r in c.attrs["HostConfig"].get("DeviceRequests") or [] for u in r.get("DeviceIDs") or []}
        visible = {u for u in visible_devices(c).split(",") if u.startswith("GPU-")}
        for uuid in labelled | requested | visible:
            held.setdefault(uuid, []).append(c.name)
    return held


def report(storm: Storm, hub: StormHub, backend: str, holders: dict[str, list[str]], args) -> None:
    reqs = storm.requests
    statuses = Counter(r.status for r in reqs)
    mix = {k: statuses.get(k, 0) for k in (201, 202, 409)}
    mix["other"] = sum(n for k, n in statuses.items() if k not in (201, 202, 409))
    print(f"storm: {len(reqs)} requests from {args.users} users at once, gpu-{backend}, "
          f"{args.a100} x A100 + {args.t4} x T4; {storm.wall:.1f} s until all settled")
    print(f"  answer time (POST sent -> HTTP status): {figures([r.answer for r in reqs if r.answer is not None])}")
    late = [r for r in reqs if r.answer is not None and r.answer > SLOW_SPAWN_TIMEOUT]
    print(f"  status mix: {mix}; answers after {SLOW_SPAWN_TIMEOUT:.0f} s: {len(late)} "
          f"({', '.join(f'{n} x {k}' for k, n in Counter(r.status for r in late).items()) or 'none'})")
    for status in (201, 202, 409):
        times = [r.answer for r in reqs if r.status == status and r.answer is not None]
        if times:
            print(f"    {status}: answer time {figures(times)}")
    others = Counter(f"{r.status} {r.message[:80]}" for r in reqs if r.status not in (201, 202, 409))
    for text, n in others.items():
        print(f"    other: {n} x {text}")
    decisions = [r.decision for r in reqs if r.decision is not None]
    print(f"  placement decision (POST sent -> 'Reserved'/'Refused' in the hub log): {figures(decisions)}")
    print(f"  POST sent -> spawner.start ('Placing' in the hub log): "
          f"{figures([r.placing for r in reqs if r.placing is not None])}")
    slow = [r for r in reqs if r.decision is not None and r.decision > SLOW_SPAWN_TIMEOUT]
    print(f"  decisions after {SLOW_SPAWN_TIMEOUT:.0f} s: {len(slow)} "
          f"({sum(r.decided == 'Refused' for r in slow)} of them refusals); "
          f"requests without a decision in the log: {sum(r.decision is None for r in reqs)}")
    for outcome, buckets in sorted(placement_histogram(hub).items()):
        if buckets and buckets[-1][1]:
            print(f"  gpuspawner_placement_seconds{{outcome={outcome}}} (bucket bounds): "
                  f"p50 <= {histogram_quantile(buckets, 0.5)} s, p99 <= {histogram_quantile(buckets, 0.99)} s "
                  f"({int(buckets[-1][1])})")
    print(f"  hub process CPU until the last answer: {storm.hub_cpu:.2f} s in {storm.answered:.2f} s "
          f"(load average before the storm: {args.load_before})")
    print(f"  hub REST latency during the storm (GET /hub/api/ every 50 ms): "
          f"{figures(storm.pings, 'ms', 1000)}")
    outcomes = Counter(r.outcome for r in reqs)
    print(f"  servers started: {outcomes.get('started', 0)}; refused: {outcomes.get('refused', 0)} at once (409), "
          f"{outcomes.get('refused late', 0)} after a 202; failed: {outcomes.get('failed', 0)} at once, "
          f"{outcomes.get('failed after a 202', 0)} after a 202 (why: the hub log, e.g. http_timeout); "
          f"still pending: {outcomes.get('still pending', 0)}")
    double = {u: h for u, h in holders.items() if len(h) > 1}
    print(f"  GPUs held by live servers: {len(holders)}; double allocations: {len(double)}")
    for uuid, names in double.items():
        print(f"    {uuid}: {', '.join(names)}")
    if args.verbose:
        for r in sorted(reqs, key=lambda r: r.sent):
            print(f"    {r.user}:{r.server} {json.dumps(r.body)} -> {r.status} in {r.answer or 0:.2f} s; "
                  f"placing {r.placing if r.placing is None else round(r.placing, 2)}, "
                  f"{r.decided or 'no decision'} {r.decision if r.decision is None else round(r.decision, 2)}; "
                  f"{r.outcome} {r.message[:100]}")


def start_engine(args):
    """A private dockerd with the stand-in NVIDIA hook, and the single-user image on it."""
    from engine import Engine, unavailable_reason  # tests/docker/engine.py

    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"cannot run --backend docker: {reason}")
    engine = Engine()
    try:
        engine.start()
        image = engine.build_image()
    except BaseException:
        engine.stop()
        raise
    return engine, image


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "docker"], default="local")
    parser.add_argument("--users", type=int, default=20, help="users (default 20)")
    parser.add_argument("--requests", type=int, default=40, help="spawn requests fired at once (default 40)")
    parser.add_argument("--a100", type=int, default=2, help="simulated A100 GPUs (default 2)")
    parser.add_argument("--t4", type=int, default=2, help="simulated T4 GPUs (default 2)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request mix (default 1)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a POST may take (default 120)")
    parser.add_argument("--settle", type=float, default=300, help="seconds to wait for 202s to settle (default 300)")
    parser.add_argument("--profile", metavar="FILE", help="record the hub with py-spy during the storm (raw stacks)")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy", help="the py-spy executable")
    parser.add_argument("--extra-config", metavar="FILE", type=Path,
                        help="Python appended to the hub's configuration (with c), e.g. to compare settings")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (hub log) and print its path")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every request")
    args = parser.parse_args()
    if not 0 < args.requests <= 500 or args.users <= 0:
        parser.error("--requests must be 1..500 and --users > 0")

    print(f"# {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    work = Path(tempfile.mkdtemp(prefix="bench-storm-"))
    engine = hub = spy = None
    try:
        image = ""
        if args.backend == "docker":
            engine, image = start_engine(args)
        extra = args.extra_config.read_text() if args.extra_config else ""
        hub = StormHub(work / "hub", args.backend, args.a100, args.t4, engine, image, extra)
        hub.start(timeout=120)
        planned = plan(args.users, args.requests, args.seed)
        r = hub.api("POST", "/users", json={"usernames": sorted({p.user for p in planned})})
        r.raise_for_status()
        if args.profile:
            spy = subprocess.Popen([args.py_spy, "record", "--pid", str(hub.proc.pid), "--format", "raw",
                                    "--rate", "200", "--output", args.profile, "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        args.load_before = Path("/proc/loadavg").read_text().split()[0]
        storm = fire(hub, planned, args.timeout, args.settle)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
            spy = None
        read_decisions(hub, planned)
        holders = holders_docker(hub) if args.backend == "docker" else holders_local(hub)
        report(storm, hub, args.backend, holders, args)
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait()
        if hub is not None:
            hub.close()
        if engine is not None:
            engine.stop()
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
