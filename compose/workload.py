#!/usr/bin/env python3
"""CRI workload generator for plegd's docker-compose demo (docs/compose.md).

Creates and destroys pods through CRI (runtime.v1, gRPC over a unix socket), as a
kubelet would, so plegd has lifecycle events to publish:

  * pods with a container that exits by itself after a few seconds (exit 0, 1 or 3):
    plegd reports ContainerDied, noticed through the CRI event stream;
  * pods with a long-running container that is later killed (StopContainer, SIGKILL
    after a grace period): ContainerDied with exit code 137 or 143;
  * exited containers "restarted" as the next attempt in the same pod: ContainerStarted;
  * once there are WORKLOAD_MAX_PODS pods, now and then the oldest one removed
    (StopPodSandbox + RemovePodSandbox): ContainerDied for the sandbox and any running
    container, then ContainerRemoved for each.

Pods use the host network namespace (NamespaceOption.network = NODE), so no CNI is
needed. Everything this tool creates carries the label plegd-demo=workload; leftovers
of an earlier run are removed at start, and all its pods at SIGTERM/SIGINT.

Environment:
  CRI_ENDPOINT       unix:///run/containerd/containerd.sock
  WORKLOAD_IMAGE     docker.io/library/busybox:1.36 (pulled through CRI if missing)
  WORKLOAD_PERIOD    seconds between two actions (default 3)
  WORKLOAD_MAX_PODS  pods alive at once (default 4)
  WORKLOAD_ROUNDS    stop after this many actions, removing its pods (default 0: forever)
  WORKLOAD_SEED      random seed (default: time)
  WORKLOAD_NAMESPACE pod namespace in the sandbox metadata (default demo)
  WORKLOAD_LOG_ROOT  containers' log directory root, in containerd's filesystem
                     (default /var/log/pods)
  CRI_PROTO          the CRI v1.proto, for generating the Python stubs at first run
                     when they were not generated at image build (default: cri/v1.proto
                     beside this file)

Needs grpcio (and grpcio-tools when the stubs must be generated).
"""
import hashlib
import os
import random
import signal
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
LABEL_KEY, LABEL_VALUE = "plegd-demo", "workload"

ENDPOINT = os.environ.get("CRI_ENDPOINT", "unix:///run/containerd/containerd.sock")
IMAGE = os.environ.get("WORKLOAD_IMAGE", "docker.io/library/busybox:1.36")
PERIOD = float(os.environ.get("WORKLOAD_PERIOD", "3"))
MAX_PODS = int(os.environ.get("WORKLOAD_MAX_PODS", "4"))
ROUNDS = int(os.environ.get("WORKLOAD_ROUNDS", "0"))
NAMESPACE = os.environ.get("WORKLOAD_NAMESPACE", "demo")
LOG_ROOT = os.environ.get("WORKLOAD_LOG_ROOT", "/var/log/pods")
TIMEOUT = 60.0  # seconds, per CRI call (RunPodSandbox may pull the pause image)

# busybox sh as PID 1 ignores SIGTERM unless it traps it; `wait` is interruptible
SLEEPER = 'trap "exit 143" TERM; sleep 3600 & wait'


def log(msg):
    print("workload: " + msg, flush=True)


def load_stubs():
    """The runtime.v1 stubs: generated at image build (v1_pb2*.py beside this file),
    else generated once from CRI_PROTO into a cache directory."""
    sys.path.insert(0, HERE)
    try:
        import v1_pb2
        import v1_pb2_grpc
        return v1_pb2, v1_pb2_grpc
    except ImportError:
        pass
    from grpc_tools import protoc  # only needed when the stubs were not pre-generated
    import grpc_tools
    proto = os.environ.get("CRI_PROTO", os.path.join(HERE, "cri", "v1.proto"))
    data = open(proto, "rb").read()
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                         "plegd-workload", hashlib.sha256(data).hexdigest()[:16])
    if not os.path.isfile(os.path.join(cache, "v1_pb2_grpc.py")):
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(cache))
        with open(os.path.join(tmp, "v1.proto"), "wb") as f:
            f.write(data)
        inc = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        if protoc.main(["protoc", "-I" + tmp, "-I" + inc, "--python_out=" + tmp,
                        "--grpc_python_out=" + tmp, os.path.join(tmp, "v1.proto")]) != 0:
            sys.exit("workload: protoc failed for " + proto)
        try:
            os.rename(tmp, cache)
        except OSError:  # another run won the race
            pass
    sys.path.insert(0, cache)
    import v1_pb2
    import v1_pb2_grpc
    return v1_pb2, v1_pb2_grpc


import grpc  # noqa: E402

pb, pbg = load_stubs()


class Pod:
    def __init__(self, pod_id, config, kind):
        self.id = pod_id
        self.config = config
        self.kind = kind  # "exits" or "sleeps"
        self.attempt = 0
        self.container = None  # id of the current attempt's container

    @property
    def name(self):
        return "%s/%s" % (self.config.metadata.namespace, self.config.metadata.name)


class Workload:
    def __init__(self, rng):
        self.rng = rng
        self.channel = grpc.insecure_channel(ENDPOINT)
        self.rt = pbg.RuntimeServiceStub(self.channel)
        self.img = pbg.ImageServiceStub(self.channel)
        self.pods = []
        self.serial = 0

    # ------------------------------------------------------------ set-up
    def wait_for_runtime(self, deadline_s=300):
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                v = self.rt.Version(pb.VersionRequest(), timeout=5)
                log("runtime %s %s (CRI %s) at %s" % (v.runtime_name, v.runtime_version,
                                                      v.runtime_api_version, ENDPOINT))
                return
            except grpc.RpcError as e:
                if time.monotonic() > deadline:
                    sys.exit("workload: the runtime at %s did not answer: %s" % (ENDPOINT, e.details()))
                time.sleep(1)

    def ensure_image(self):
        spec = pb.ImageSpec(image=IMAGE)
        if self.img.ImageStatus(pb.ImageStatusRequest(image=spec), timeout=TIMEOUT).image.id:
            return
        log("pulling %s" % IMAGE)
        ref = self.img.PullImage(pb.PullImageRequest(image=spec), timeout=600).image_ref
        log("pulled %s (%s)" % (IMAGE, ref))

    def remove_leftovers(self):
        sel = pb.PodSandboxFilter(label_selector={LABEL_KEY: LABEL_VALUE})
        for p in self.rt.ListPodSandbox(pb.ListPodSandboxRequest(filter=sel), timeout=TIMEOUT).items:
            self.remove_pod_id(p.id, "%s/%s" % (p.metadata.namespace, p.metadata.name), "left over")

    # ------------------------------------------------------------ actions
    def create_pod(self):
        self.serial += 1
        kind = "exits" if self.serial % 2 else "sleeps"
        name = "%s-%d" % ("batch" if kind == "exits" else "web", self.serial)
        uid = str(uuid.uuid4())
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=NAMESPACE, attempt=0),
            log_directory=os.path.join(LOG_ROOT, "%s_%s_%s" % (NAMESPACE, name, uid)),
            labels={LABEL_KEY: LABEL_VALUE},
            linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE))))
        pod_id = self.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=TIMEOUT).pod_sandbox_id
        pod = Pod(pod_id, config, kind)
        self.pods.append(pod)
        log("created pod %s (uid %s, sandbox %s)" % (pod.name, uid, pod_id[:13]))
        self.start_container(pod)

    def start_container(self, pod):
        if pod.kind == "exits":
            secs, code = self.rng.randint(2, 8), self.rng.choice([0, 1, 3])
            script, what = "sleep %d; exit %d" % (secs, code), "exits %d after %ds" % (code, secs)
        else:
            script, what = SLEEPER, "runs until stopped"
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="main", attempt=pod.attempt),
            image=pb.ImageSpec(image=IMAGE),
            command=["sh", "-c", script],
            log_path="main/%d.log" % pod.attempt,
            labels={LABEL_KEY: LABEL_VALUE},
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE))))
        cid = self.rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config), timeout=TIMEOUT).container_id
        self.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=TIMEOUT)
        pod.container = cid
        log("started container %s of %s, attempt %d: %s" % (cid[:13], pod.name, pod.attempt, what))

    def container_state(self, pod):
        return self.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=pod.container),
                                       timeout=TIMEOUT).status

    def stop_container(self, pod):
        grace = self.rng.choice([0, 2])  # 0: SIGKILL at once; 2: SIGTERM, which it traps
        self.rt.StopContainer(pb.StopContainerRequest(container_id=pod.container, timeout=grace),
                              timeout=TIMEOUT + grace)
        st = self.container_state(pod)
        log("stopped container %s of %s (grace %ds): exit code %d" % (
            pod.container[:13], pod.name, grace, st.exit_code))

    def restart_container(self, pod):
        """Like kubelet's restart: remove the exited attempt, create the next one."""
        old = pod.container
        self.rt.RemoveContainer(pb.RemoveContainerRequest(container_id=old), timeout=TIMEOUT)
        pod.attempt += 1
        log("removed exited container %s of %s" % (old[:13], pod.name))
        self.start_container(pod)

    def remove_pod_id(self, pod_id, name, why):
        self.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=TIMEOUT)
        self.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=TIMEOUT)
        log("removed pod %s (sandbox %s, %s)" % (name, pod_id[:13], why))

    def step(self):
        """One action: fill up to MAX_PODS, else change one pod."""
        if len(self.pods) < MAX_PODS:
            self.create_pod()
            return
        if self.rng.random() < 0.25:
            pod = self.pods.pop(0)  # the oldest
            self.remove_pod_id(pod.id, pod.name, "done")
            return
        pod = self.rng.choice(self.pods)
        if self.container_state(pod).state == pb.CONTAINER_RUNNING:
            self.stop_container(pod)
        else:
            self.restart_container(pod)

    def remove_all(self):
        for pod in list(self.pods):
            try:
                self.remove_pod_id(pod.id, pod.name, "shutting down")
            except grpc.RpcError as e:
                log("could not remove %s: %s" % (pod.name, e.details()))
        self.pods.clear()


def main():
    seed = int(os.environ.get("WORKLOAD_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))

    w = Workload(rng)
    w.wait_for_runtime()
    w.ensure_image()
    w.remove_leftovers()
    log("seed %d, one action every %.1fs, up to %d pods, image %s" % (seed, PERIOD, MAX_PODS, IMAGE))
    done = 0
    while not stop and (ROUNDS == 0 or done < ROUNDS):
        try:
            w.step()
        except grpc.RpcError as e:  # e.g. containerd restarting: carry on
            log("CRI call failed: %s: %s" % (e.code().name, e.details()))
            # forget pods whose sandbox is gone, keep the others
            try:
                live = {p.id for p in w.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=TIMEOUT).items}
                w.pods = [p for p in w.pods if p.id in live]
            except grpc.RpcError:
                pass
        done += 1
        deadline = time.monotonic() + PERIOD
        while not stop and time.monotonic() < deadline:
            time.sleep(0.1)
    w.remove_all()
    log("stopped after %d actions" % done)


if __name__ == "__main__":
    main()
