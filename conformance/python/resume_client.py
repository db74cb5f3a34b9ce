"""A stock grpcio client resuming a Watch across plegd restarts, driven by
plegd/tests/conformance.rs (`grpcio_resumes_a_watch_across_killed_restarts`): it
prints the Hello and then every event and gap as one JSON line each, and exits 0
once it has printed an event of type UNTIL_TYPE for container UNTIL_ID.

usage: resume_client.py SINCE INSTANCE UNTIL_TYPE UNTIL_ID
  SINCE     the Watch's since_revision (0: from the oldest event in the history)
  INSTANCE  the instance_id to resume (empty: none)
Environment: PLEGD_SOCKET and PLEGD_PROTO_DIR, as for the suite (conftest.py).
"""

import json
import os
import sys

from google.protobuf.json_format import MessageToDict

from conftest import connect, plegd_pb2


def main(since, instance, until_type, until_id):
    _, stub = connect(os.environ["PLEGD_SOCKET"])
    req = plegd_pb2.WatchRequest(since_revision=int(since), instance_id=instance)
    for msg in stub.Watch(req, timeout=60):
        kind = msg.WhichOneof("kind")
        if kind == "bookmark":
            continue
        line = MessageToDict(getattr(msg, kind), preserving_proto_field_name=True)
        print(json.dumps({kind: line}), flush=True)
        if kind == "event" and line.get("type") == until_type and line.get("container_id") == until_id:
            return 0
    print("the stream ended", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
