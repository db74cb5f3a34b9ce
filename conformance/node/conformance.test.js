// plegd.v1 as @grpc/grpc-js sees it, over its default unix-socket target: every RPC,
// the Watch contract (filters, initial events, bookmarks, live events, resume), the
// error codes and their `plegd-reason`, grpc.health.v1 and reflection.
//
// Run against a `plegd demo` (namespace `demo`, pods churning) by
// plegd/tests/conformance.rs, with `node --test`. Environment:
//   PLEGD_SOCKET          the API socket (required)
//   PLEGD_CONTROL_SOCKET  the socket serving Sync and RequestRelist (default: PLEGD_SOCKET)
//   PLEGD_PROTO_DIR       the directory holding plegd/v1/plegd.proto (required)
//   PLEGD_NODE_NAME       the node name plegd answers with (required)
//   PLEGD_HISTORY_EVENTS  plegd's --history-events (required: the too-old case)
'use strict';

const assert = require('node:assert/strict');
const path = require('node:path');
const { test, after } = require('node:test');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const socketPath = process.env.PLEGD_SOCKET;
const controlSocketPath = process.env.PLEGD_CONTROL_SOCKET || socketPath;
const protoDir = process.env.PLEGD_PROTO_DIR;
const nodeName = process.env.PLEGD_NODE_NAME;
const historyEvents = Number(process.env.PLEGD_HISTORY_EVENTS);
// Generous: the suite shares a small CI machine with the build.
const TIMEOUT_MS = 30000;

const options = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
const definition = protoLoader.loadSync(path.join(protoDir, 'plegd/v1/plegd.proto'), {
  ...options,
  includeDirs: [protoDir],
});
const plegd = grpc.loadPackageDefinition(definition).plegd.v1;
const standard = grpc.loadPackageDefinition(
  protoLoader.loadSync([path.join(__dirname, 'proto/health.proto'), path.join(__dirname, 'proto/reflection.proto')], options),
).grpc;

function connect(socketPath) {
  // grpc-js's default target for a unix socket, no authority override (the README's
  // Node example is these lines).
  const client = new plegd.Plegd('unix://' + socketPath, grpc.credentials.createInsecure());
  return client;
}

const client = connect(socketPath);
const control = connect(controlSocketPath);
// Every stream a test opened: an open stream keeps the process alive.
const streams = new Set();
after(() => {
  for (const r of streams) r.cancel();
  client.close();
  control.close();
});

const deadline = () => new Date(Date.now() + TIMEOUT_MS);

function unary(c, method, req) {
  return new Promise((resolve, reject) => {
    c[method](req, { deadline: deadline() }, (err, res) => (err ? reject(err) : resolve(res)));
  });
}

// A stream's messages (or its error) in order, each awaited with a deadline.
class Reader {
  constructor(call) {
    this.call = call;
    this.items = [];
    this.waiting = null;
    streams.add(this);
    call.on('data', (m) => this.push({ msg: m }));
    call.on('error', (e) => this.push({ err: e }));
    call.on('end', () => this.push({ end: true }));
  }

  push(item) {
    this.items.push(item);
    if (this.waiting) {
      const w = this.waiting;
      this.waiting = null;
      w();
    }
  }

  async next() {
    if (this.items.length === 0) {
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`nothing on the stream within ${TIMEOUT_MS} ms`)), TIMEOUT_MS);
        this.waiting = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    const item = this.items.shift();
    if (item.err) throw item.err;
    assert.ok(!item.end, 'the stream ended');
    return item.msg;
  }

  // Reads until the stream fails; returns the error.
  async error() {
    for (;;) {
      try {
        await this.next();
      } catch (e) {
        return e;
      }
    }
  }

  cancel() {
    streams.delete(this);
    this.call.on('error', () => {});
    this.call.cancel();
  }
}

const watch = (req) => new Reader(client.Watch(req));

async function hello(r) {
  const msg = await r.next();
  assert.equal(msg.kind, 'hello', JSON.stringify(msg));
  return msg.hello;
}

async function waitFor(what, cond, timeoutMs = 60000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const got = await cond();
    if (got) return got;
    if (Date.now() > end) assert.fail(`${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const reason = (err) => err.metadata && err.metadata.get('plegd-reason')[0];
const listPods = () => unary(client, 'ListPods', {});

test('Hello', async () => {
  const r = watch({});
  const h = await hello(r);
  assert.match(h.instance_id, /^[0-9a-f]{32}$/);
  assert.equal(h.node_name, nodeName);
  assert.deepEqual(h.hint_sources.map((s) => s.name).sort(), ['containerd-events', 'cri-events', 'nri']);
  r.cancel();
});

test('Watch: filtered initial events, their bookmark, then live events', async () => {
  const types = ['CONTAINER_STARTED', 'CONTAINER_DIED'];
  const r = watch({ namespaces: ['demo'], types, label_selector: 'tier!=db', send_initial_events: true });
  await hello(r);
  const snapshot = [];
  let end;
  for (;;) {
    const msg = await r.next();
    if (msg.kind === 'bookmark') {
      end = msg.bookmark;
      break;
    }
    assert.equal(msg.kind, 'event');
    snapshot.push(msg.event);
  }
  assert.ok(end.initial_events_end);
  assert.ok(snapshot.length > 0, "the demo's pods in the initial events");
  for (const e of snapshot) {
    assert.ok(e.snapshot && e.pod_namespace === 'demo' && types.includes(e.type), JSON.stringify(e));
    assert.ok(e.revision <= end.revision);
  }
  let previous = end.revision;
  for (let i = 0; i < 5; i++) {
    const msg = await r.next();
    assert.equal(msg.kind, 'event', JSON.stringify(msg));
    const e = msg.event;
    assert.ok(!e.snapshot && e.pod_namespace === 'demo' && types.includes(e.type), JSON.stringify(e));
    assert.ok(e.revision > previous);
    previous = e.revision;
  }
  r.cancel();
});

test('Watch by pod UID sends only that pod', async () => {
  const uid = (await listPods()).pods[0].pod_uid;
  const r = watch({ pod_uids: [uid], send_initial_events: true });
  await hello(r);
  for (;;) {
    const msg = await r.next();
    if (msg.kind === 'bookmark') break;
    assert.equal(msg.event.pod_uid, uid);
  }
  r.cancel();
});

test('an idle Watch gets bookmarks', async () => {
  const r = watch({ namespaces: ['no-such-namespace'], bookmark_interval_seconds: 1 });
  const h = await hello(r);
  const msg = await r.next();
  assert.equal(msg.kind, 'bookmark', JSON.stringify(msg));
  assert.ok(!msg.bookmark.initial_events_end);
  assert.ok(msg.bookmark.revision >= h.latest_revision);
  r.cancel();
});

test('resume by since_revision replays what followed', async () => {
  const r = watch({});
  const h = await hello(r);
  const seen = [];
  while (seen.length < 6) {
    const msg = await r.next();
    assert.equal(msg.kind, 'event', JSON.stringify(msg));
    seen.push(msg.event);
  }
  r.cancel();
  const resumed = watch({ since_revision: seen[0].revision, instance_id: h.instance_id });
  await hello(resumed);
  const replayed = [];
  while (replayed.length < 5) {
    const msg = await resumed.next();
    assert.equal(msg.kind, 'event', JSON.stringify(msg));
    replayed.push(msg.event);
  }
  resumed.cancel();
  const key = (e) => [e.revision, e.pod_uid, e.type, e.container_id].join('/');
  assert.deepEqual(replayed.map(key), seen.slice(1).map(key));
});

test('FAILED_PRECONDITION names its reason in plegd-reason', async () => {
  const h = await hello(watch({}));
  const cases = [
    ['future', { since_revision: h.latest_revision + 1000000 }],
    ['other-instance', { since_revision: 1, instance_id: '0'.repeat(32) }],
  ];
  for (const [want, req] of cases) {
    const err = await watch(req).error();
    assert.equal(err.code, grpc.status.FAILED_PRECONDITION, `${want}: ${err.message}`);
    assert.equal(reason(err), want);
  }
  await waitFor('the history to outrun revision 1', async () => (await listPods()).revision > historyEvents + 10);
  const err = await watch({ since_revision: 1, instance_id: h.instance_id }).error();
  assert.equal(err.code, grpc.status.FAILED_PRECONDITION, err.message);
  assert.equal(reason(err), 'too-old');
});

test('ListPods', async () => {
  const h = await hello(watch({}));
  const list = await listPods();
  assert.equal(list.instance_id, h.instance_id);
  assert.equal(list.node_name, nodeName);
  assert.ok(list.revision >= h.latest_revision);
  assert.ok(list.pods.length > 0);
  for (const p of list.pods) {
    assert.ok(p.pod_uid && p.pod_namespace === 'demo', JSON.stringify(p));
    assert.ok(p.read_at_unix_nano > 0);
    for (const c of p.containers) assert.notEqual(c.state, 'CONTAINER_STATE_UNSPECIFIED');
  }
});

test('GetPodStatus with newer_than; NOT_FOUND for an unknown pod', async () => {
  const uid = (await listPods()).pods[0].pod_uid;
  // Milliseconds are enough: a Number cannot hold nanoseconds exactly.
  const now = Date.now() * 1e6;
  const got = await unary(client, 'GetPodStatus', { pod_uid: uid, newer_than_unix_nano: now });
  assert.equal(got.pod.pod_uid, uid);
  // Covered by a relist that began after `now` (one that read the pod, or a global
  // one that found it unchanged: then read_at may be older).
  assert.notEqual(got.covered_by, 'RELIST_SOURCE_UNSPECIFIED');
  assert.ok(got.covered_at_unix_nano > now);
  const err = await unary(client, 'GetPodStatus', { pod_uid: 'no-such-pod' }).catch((e) => e);
  assert.equal(err.code, grpc.status.NOT_FOUND, err.message);
});

test('GetPodStatus of a removed pod is its tombstone', async () => {
  const first = new Set((await listPods()).pods.map((p) => p.pod_uid));
  const uid = await waitFor('a demo pod to be replaced', async () => {
    const now = new Set((await listPods()).pods.map((p) => p.pod_uid));
    return [...first].find((u) => !now.has(u));
  });
  const got = await unary(client, 'GetPodStatus', { pod_uid: uid });
  assert.equal(got.pod.pod_uid, uid);
  assert.ok(got.removed_at_unix_nano > 0);
});

function begin(c, uid) {
  const call = c.Sync();
  const r = new Reader(call);
  call.write({ begin: { pod_uid: uid } });
  return { call, r };
}

test('Sync: held, released, cancelled on disconnect', async () => {
  const uid = 'conformance-node-sync';
  const a = begin(control, uid);
  const held = await a.r.next();
  assert.equal(held.kind, 'held', JSON.stringify(held));
  assert.equal(held.held.node_name, nodeName);
  // Held: a second sync of the pod is refused.
  const b = begin(control, uid);
  const refused = await b.r.error();
  assert.equal(refused.code, grpc.status.ALREADY_EXISTS, refused.message);
  // Released on end.
  a.call.write({ end: { outcome: 'SYNC_SUCCESS' } });
  assert.equal((await a.r.next()).kind, 'released');
  // A holder whose connection goes away: the hold is cancelled, the pod free again.
  const other = connect(controlSocketPath);
  const c = begin(other, uid);
  assert.equal((await c.r.next()).kind, 'held');
  c.r.cancel();
  other.close();
  await waitFor("the disconnected holder's sync to end", async () => {
    const d = begin(control, uid);
    try {
      const msg = await d.r.next();
      assert.equal(msg.kind, 'held');
      d.call.write({ end: { outcome: 'SYNC_FAILURE' } });
      return true;
    } catch (e) {
      assert.equal(e.code, grpc.status.ALREADY_EXISTS, e.message);
      return false;
    }
  });
});

test('RequestRelist', async () => {
  const uid = (await listPods()).pods[0].pod_uid;
  const got = await unary(control, 'RequestRelist', { pod_uid: uid, source: 'POST_ALLOCATION' });
  assert.equal(got.queued, true);
  assert.ok(['RELIST_REQUEST_QUEUED', 'RELIST_REQUEST_COALESCED'].includes(got.outcome), got.outcome);
  const err = await unary(control, 'RequestRelist', { pod_uid: uid, source: 'GLOBAL' }).catch((e) => e);
  assert.equal(err.code, grpc.status.INVALID_ARGUMENT, err.message);
});

test('Sync and RequestRelist are refused on the read socket', async () => {
  const uid = (await listPods()).pods[0].pod_uid;
  const err = await unary(client, 'RequestRelist', { pod_uid: uid, source: 'POST_ALLOCATION' }).catch((e) => e);
  assert.equal(err.code, grpc.status.PERMISSION_DENIED, err.message);
  const s = begin(client, uid);
  const refused = await s.r.error();
  assert.equal(refused.code, grpc.status.PERMISSION_DENIED, refused.message);
});

test('ListClients shows a watcher and a hold', async () => {
  const uid = 'conformance-node-listed';
  const w = watch({ namespaces: ['conformance-ns'] });
  await hello(w);
  const s = begin(control, uid);
  assert.equal((await s.r.next()).kind, 'held');
  const got = await unary(client, 'ListClients', {});
  assert.ok(got.watchers.some((c) => c.filter.includes('conformance-ns')), JSON.stringify(got));
  assert.ok(got.holds.some((h) => h.pod_uid === uid), JSON.stringify(got));
  s.call.write({ end: { outcome: 'SYNC_SUCCESS' } });
  assert.equal((await s.r.next()).kind, 'released');
  w.cancel();
});

test('INVALID_ARGUMENT for malformed requests', async () => {
  const bad = {
    'bad selector': { label_selector: 'app in (a,b)' },
    'unspecified type': { types: ['EVENT_TYPE_UNSPECIFIED'] },
    'initial events and since_revision': { send_initial_events: true, since_revision: 1 },
    'bookmark interval': { bookmark_interval_seconds: 100000 },
  };
  for (const [name, req] of Object.entries(bad)) {
    const err = await watch(req).error();
    assert.equal(err.code, grpc.status.INVALID_ARGUMENT, `${name}: ${err.message}`);
    assert.ok(err.details, name);
  }
  const err = await unary(client, 'GetPodStatus', {}).catch((e) => e);
  assert.equal(err.code, grpc.status.INVALID_ARGUMENT, err.message);
});

test('grpc.health.v1 Check', async () => {
  const health = new standard.health.v1.Health('unix://' + socketPath, grpc.credentials.createInsecure());
  const status = async (service) => (await unary(health, 'Check', { service })).status;
  await waitFor('health SERVING', async () => (await status('')) === 'SERVING');
  assert.equal(await status('plegd.v1.Plegd'), 'SERVING');
  const err = await status('no.such.Service').catch((e) => e);
  assert.equal(err.code, grpc.status.NOT_FOUND, err.message);
  health.close();
});

test('reflection lists the services', async () => {
  const reflection = new standard.reflection.v1.ServerReflection('unix://' + socketPath, grpc.credentials.createInsecure());
  const r = new Reader(reflection.ServerReflectionInfo());
  r.call.write({ list_services: '' });
  const msg = await r.next();
  const names = msg.list_services_response.service.map((s) => s.name);
  for (const want of ['plegd.v1.Plegd', 'grpc.health.v1.Health', 'grpc.reflection.v1.ServerReflection']) {
    assert.ok(names.includes(want), `${want} in ${names}`);
  }
  r.call.end();
  reflection.close();
});
