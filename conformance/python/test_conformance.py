"""plegd.v1 as grpcio (gRPC C-core) sees it, over its default unix-socket target:
every RPC, the Watch contract (filters, initial events, bookmarks, live events,
resume), the error codes and their `plegd-reason`, grpc.health.v1 and reflection.

Run against a `plegd demo` (namespace `demo`, pods churning) by
plegd/tests/conformance.rs; conftest.py documents the environment.
"""

import queue
import re
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from conftest import connect

# Generous: the suite shares a small CI machine with the build.
TIMEOUT = 30.0


class Reader:
    """A Watch stream read on a thread, so a test can wait with a deadline."""

    def __init__(self, call):
        self.call = call
        self.items = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for msg in self.call:
                self.items.put(msg)
            self.items.put(None)
        except grpc.RpcError as e:
            self.items.put(e)

    def next(self, timeout=TIMEOUT):
        try:
            item = self.items.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"nothing on the stream within {timeout}s")
        if isinstance(item, grpc.RpcError):
            raise item
        assert item is not None, "the stream ended"
        return item

    def cancel(self):
        self.call.cancel()


def watch(stub, **req):
    from conftest import plegd_pb2

    return Reader(stub.Watch(plegd_pb2.WatchRequest(**req)))


def hello_of(reader):
    msg = reader.next()
    assert msg.WhichOneof("kind") == "hello", msg
    return msg.hello


def reason(err):
    return dict(err.trailing_metadata() or ()).get("plegd-reason")


def wait_for(what, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.05)


def test_hello(stub, node_name):
    r = watch(stub)
    hello = hello_of(r)
    assert re.fullmatch(r"[0-9a-f]{32}", hello.instance_id), hello.instance_id
    assert hello.node_name == node_name
    names = {s.name for s in hello.hint_sources}
    assert names == {"cri-events", "nri", "containerd-events"}, names
    r.cancel()


def test_watch_initial_events_with_filters_then_bookmark_then_live(stub, pb):
    types = [pb.CONTAINER_STARTED, pb.CONTAINER_DIED]
    r = watch(
        stub,
        namespaces=["demo"],
        types=types,
        label_selector="tier!=db",
        send_initial_events=True,
    )
    hello_of(r)
    snapshot = []
    while True:
        msg = r.next()
        kind = msg.WhichOneof("kind")
        if kind == "bookmark":
            end = msg.bookmark
            break
        assert kind == "event", msg
        snapshot.append(msg.event)
    assert end.initial_events_end
    assert snapshot, "the demo's pods in the initial events"
    for e in snapshot:
        assert e.snapshot and e.pod_namespace == "demo" and e.type in types, e
        assert e.revision <= end.revision
    live = []
    while len(live) < 5:
        msg = r.next()
        assert msg.WhichOneof("kind") == "event", msg
        live.append(msg.event)
    previous = end.revision
    for e in live:
        assert not e.snapshot and e.pod_namespace == "demo" and e.type in types, e
        assert e.revision > previous
        previous = e.revision
    r.cancel()


def test_watch_by_pod_uid_sends_only_that_pod(stub):
    from conftest import plegd_pb2

    uid = stub.ListPods(plegd_pb2.ListPodsRequest(), timeout=TIMEOUT).pods[0].pod_uid
    r = watch(stub, pod_uids=[uid], send_initial_events=True)
    hello_of(r)
    while True:
        msg = r.next()
        if msg.WhichOneof("kind") == "bookmark":
            break
        assert msg.event.pod_uid == uid, msg
    r.cancel()


def test_idle_watch_gets_bookmarks(stub):
    r = watch(stub, namespaces=["no-such-namespace"], bookmark_interval_seconds=1)
    hello = hello_of(r)
    msg = r.next()
    assert msg.WhichOneof("kind") == "bookmark", msg
    assert not msg.bookmark.initial_events_end
    assert msg.bookmark.revision >= hello.latest_revision
    r.cancel()


def test_resume_by_since_revision_replays_what_followed(stub):
    r = watch(stub)
    hello = hello_of(r)
    seen = []
    while len(seen) < 6:
        msg = r.next()
        assert msg.WhichOneof("kind") == "event", msg
        seen.append(msg.event)
    r.cancel()
    resumed = watch(stub, since_revision=seen[0].revision, instance_id=hello.instance_id)
    hello_of(resumed)
    replayed = []
    while len(replayed) < 5:
        msg = resumed.next()
        assert msg.WhichOneof("kind") == "event", msg
        replayed.append(msg.event)
    resumed.cancel()
    key = lambda e: (e.revision, e.pod_uid, e.type, e.container_id)  # noqa: E731
    assert [key(e) for e in replayed] == [key(e) for e in seen[1:]]


def test_failed_precondition_reasons(stub, history_events):
    from conftest import plegd_pb2

    hello = hello_of(watch(stub))
    cases = [
        ("future", dict(since_revision=hello.latest_revision + 1_000_000)),
        ("other-instance", dict(since_revision=1, instance_id="0" * 32)),
    ]
    for want, req in cases:
        with pytest.raises(grpc.RpcError) as err:
            r = watch(stub, **req)
            while True:
                r.next()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, (want, err.value)
        assert reason(err.value) == want
    # too-old: once the history has moved past revision 1.
    wait_for(
        "the history to outrun revision 1",
        lambda: stub.ListPods(plegd_pb2.ListPodsRequest(), timeout=TIMEOUT).revision
        > history_events + 10,
    )
    with pytest.raises(grpc.RpcError) as err:
        r = watch(stub, since_revision=1, instance_id=hello.instance_id)
        while True:
            r.next()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value
    assert reason(err.value) == "too-old"


def test_list_pods(stub, pb, node_name):
    hello = hello_of(watch(stub))
    pods = stub.ListPods(pb.ListPodsRequest(), timeout=TIMEOUT)
    assert pods.instance_id == hello.instance_id
    assert pods.node_name == node_name
    assert pods.revision >= hello.latest_revision
    assert pods.pods
    for p in pods.pods:
        assert p.pod_uid and p.pod_namespace == "demo", p
        assert p.read_at_unix_nano > 0
        for c in p.containers:
            assert c.state != pb.CONTAINER_STATE_UNSPECIFIED, c


def test_get_pod_status_newer_than_and_unknown(stub, pb):
    uid = stub.ListPods(pb.ListPodsRequest(), timeout=TIMEOUT).pods[0].pod_uid
    now = time.time_ns()
    got = stub.GetPodStatus(
        pb.GetPodStatusRequest(pod_uid=uid, newer_than_unix_nano=now), timeout=TIMEOUT
    )
    assert got.pod.pod_uid == uid
    # Covered by a relist that began after `now` (one that read the pod, or a global
    # one that found it unchanged: then read_at may be older).
    assert got.covered_by != pb.RELIST_SOURCE_UNSPECIFIED, got
    assert got.covered_at_unix_nano > now
    with pytest.raises(grpc.RpcError) as err:
        stub.GetPodStatus(pb.GetPodStatusRequest(pod_uid="no-such-pod"), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_get_pod_status_of_a_removed_pod_is_its_tombstone(stub, pb):
    first = {p.pod_uid for p in stub.ListPods(pb.ListPodsRequest(), timeout=TIMEOUT).pods}

    def removed():
        now = {p.pod_uid for p in stub.ListPods(pb.ListPodsRequest(), timeout=TIMEOUT).pods}
        return sorted(first - now)

    uid = wait_for("a demo pod to be replaced", removed)[0]
    got = stub.GetPodStatus(pb.GetPodStatusRequest(pod_uid=uid), timeout=TIMEOUT)
    assert got.pod.pod_uid == uid
    assert got.HasField("removed_at_unix_nano") and got.removed_at_unix_nano > 0


class Sync:
    """A Sync stream: requests from a queue, responses read on a thread."""

    def __init__(self, stub):
        self.requests = queue.Queue()
        self.reader = Reader(stub.Sync(iter(self.requests.get, None)))

    def send(self, **kind):
        from conftest import plegd_pb2

        self.requests.put(plegd_pb2.SyncRequest(**kind))

    def close(self):
        self.requests.put(None)


def begin(stub, pb, uid):
    s = Sync(stub)
    s.send(begin=pb.SyncBegin(pod_uid=uid))
    return s


def test_sync_held_released_and_cancelled_on_disconnect(control, control_socket_path, pb, node_name):
    uid = "conformance-python-sync"
    a = begin(control, pb, uid)
    held = a.reader.next()
    assert held.WhichOneof("kind") == "held", held
    assert held.held.node_name == node_name
    # Held: a second sync of the pod is refused.
    b = begin(control, pb, uid)
    with pytest.raises(grpc.RpcError) as err:
        b.reader.next()
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    # Released on end.
    a.send(end=pb.SyncEnd(outcome=pb.SYNC_SUCCESS))
    released = a.reader.next()
    assert released.WhichOneof("kind") == "released", released
    # A holder whose connection goes away: the hold is cancelled, the pod free again.
    ch, stub = connect(control_socket_path)
    c = begin(stub, pb, uid)
    assert c.reader.next().WhichOneof("kind") == "held"
    ch.close()

    def held_again():
        d = begin(control, pb, uid)
        try:
            msg = d.reader.next()
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.ALREADY_EXISTS, e
            return None
        assert msg.WhichOneof("kind") == "held", msg
        d.send(end=pb.SyncEnd(outcome=pb.SYNC_FAILURE))
        return True

    wait_for("the disconnected holder's sync to end", held_again)


def test_request_relist(control, stub, pb):
    uid = stub.ListPods(pb.ListPodsRequest(), timeout=TIMEOUT).pods[0].pod_uid
    got = control.RequestRelist(
        pb.RequestRelistRequest(pod_uid=uid, source=pb.POST_ALLOCATION), timeout=TIMEOUT
    )
    assert got.queued
    assert got.outcome in (pb.RELIST_REQUEST_QUEUED, pb.RELIST_REQUEST_COALESCED), got
    with pytest.raises(grpc.RpcError) as err:
        control.RequestRelist(pb.RequestRelistRequest(pod_uid=uid, source=pb.GLOBAL), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_control_calls_are_refused_on_the_read_socket(stub, pb):
    uid = stub.ListPods(pb.ListPodsRequest(), timeout=TIMEOUT).pods[0].pod_uid
    with pytest.raises(grpc.RpcError) as err:
        stub.RequestRelist(
            pb.RequestRelistRequest(pod_uid=uid, source=pb.POST_ALLOCATION), timeout=TIMEOUT
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    s = begin(stub, pb, uid)
    with pytest.raises(grpc.RpcError) as err:
        s.reader.next()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_list_clients_shows_a_watcher_and_a_hold(control, stub, pb):
    uid = "conformance-python-listed"
    w = watch(stub, namespaces=["conformance-ns"])
    assert w.next().WhichOneof("kind") == "hello"
    s = begin(control, pb, uid)
    assert s.reader.next().WhichOneof("kind") == "held"
    got = stub.ListClients(pb.ListClientsRequest(), timeout=TIMEOUT)
    assert any("conformance-ns" in c.filter for c in got.watchers), got
    assert any(h.pod_uid == uid for h in got.holds), got
    s.send(end=pb.SyncEnd(outcome=pb.SYNC_SUCCESS))
    assert s.reader.next().WhichOneof("kind") == "released"
    w.cancel()


@pytest.mark.parametrize(
    "req",
    [
        dict(label_selector="app in (a,b)"),
        dict(types=[0]),
        dict(send_initial_events=True, since_revision=1),
        dict(bookmark_interval_seconds=100_000),
    ],
    ids=["bad-selector", "unspecified-type", "initial-and-since", "bookmark-interval"],
)
def test_watch_invalid_argument(stub, req):
    with pytest.raises(grpc.RpcError) as err:
        r = watch(stub, **req)
        while True:
            r.next()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert err.value.details()


def test_get_pod_status_without_uid_is_invalid(stub, pb):
    with pytest.raises(grpc.RpcError) as err:
        stub.GetPodStatus(pb.GetPodStatusRequest(), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_check(channel):
    health = health_pb2_grpc.HealthStub(channel)

    def serving(service):
        got = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
        return got.status == health_pb2.HealthCheckResponse.SERVING

    wait_for("health SERVING", lambda: serving(""))
    assert serving("plegd.v1.Plegd")
    with pytest.raises(grpc.RpcError) as err:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_the_services(channel):
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {"plegd.v1.Plegd", "grpc.health.v1.Health"} <= services, services
    proto = db.FindFileContainingSymbol("plegd.v1.Plegd")
    assert proto.package == "plegd.v1"
    assert "Watch" in [m.name for m in proto.service[0].method]
