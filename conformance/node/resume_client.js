// A stock @grpc/grpc-js client resuming a Watch across plegd restarts, driven by
// plegd/tests/conformance.rs (`grpc_js_resumes_a_watch_across_killed_restarts`): it
// prints the Hello and then every event and gap as one JSON line each (uint64 as
// strings, enums by name, as proto3 JSON), and exits 0 once it has printed an event of
// type UNTIL_TYPE for container UNTIL_ID.
//
// usage: node resume_client.js SINCE INSTANCE UNTIL_TYPE UNTIL_ID
//   SINCE     the Watch's since_revision (0: from the oldest event in the history)
//   INSTANCE  the instance_id to resume (empty: none)
// Environment: PLEGD_SOCKET and PLEGD_PROTO_DIR, as for the suite.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [since, instance, untilType, untilId] = process.argv.slice(2);
const protoDir = process.env.PLEGD_PROTO_DIR;
const definition = protoLoader.loadSync(path.join(protoDir, 'plegd/v1/plegd.proto'), {
  keepCase: true,
  longs: String,
  enums: String,
  oneofs: true,
  includeDirs: [protoDir],
});
const plegd = grpc.loadPackageDefinition(definition).plegd.v1;
const client = new plegd.Plegd('unix://' + process.env.PLEGD_SOCKET, grpc.credentials.createInsecure());
const call = client.Watch(
  { since_revision: since, instance_id: instance },
  { deadline: new Date(Date.now() + 60000) },
);
call.on('data', (msg) => {
  if (msg.kind === 'bookmark') return;
  const body = msg[msg.kind];
  process.stdout.write(JSON.stringify({ [msg.kind]: body }) + '\n');
  if (msg.kind === 'event' && body.type === untilType && body.container_id === untilId) {
    call.cancel();
    client.close();
    process.exitCode = 0;
  }
});
call.on('error', (err) => {
  if (err.code === grpc.status.CANCELLED && process.exitCode === 0) return;
  process.stderr.write(`the stream failed: ${err.message}\n`);
  process.exitCode = 1;
});
call.on('end', () => {
  if (process.exitCode !== 0) {
    process.stderr.write('the stream ended\n');
    process.exitCode = 1;
  }
});
process.exitCode = 1;
