"""Fixtures of the grpcio conformance suite: the plegd.v1 stubs, generated from the
proto with grpcio-tools into a temporary directory, and channels to the sockets.

Environment (set by plegd/tests/conformance.rs):
  PLEGD_SOCKET          the API socket (required)
  PLEGD_CONTROL_SOCKET  the socket serving Sync and RequestRelist (default: PLEGD_SOCKET)
  PLEGD_PROTO_DIR       the directory holding plegd/v1/plegd.proto (required)
  PLEGD_NODE_NAME       the node name plegd answers with (required)
  PLEGD_HISTORY_EVENTS  plegd's --history-events (required: the too-old case)
"""

import atexit
import importlib
import os
import shutil
import sys
import tempfile

import grpc
import pytest
from grpc_tools import protoc


def _generate(proto_dir):
    out = tempfile.mkdtemp(prefix="plegd-py-stubs-")
    # Imported by then: the directory is not needed after the process ends.
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            os.path.join(proto_dir, "plegd", "v1", "plegd.proto"),
        ]
    )
    assert code == 0, f"protoc failed on {proto_dir}"
    sys.path.insert(0, out)
    return (
        importlib.import_module("plegd.v1.plegd_pb2"),
        importlib.import_module("plegd.v1.plegd_pb2_grpc"),
    )


plegd_pb2, plegd_pb2_grpc = _generate(os.environ["PLEGD_PROTO_DIR"])


@pytest.fixture(scope="session")
def pb():
    return plegd_pb2


@pytest.fixture(scope="session")
def socket_path():
    return os.environ["PLEGD_SOCKET"]


@pytest.fixture(scope="session")
def control_socket_path():
    return os.environ.get("PLEGD_CONTROL_SOCKET") or os.environ["PLEGD_SOCKET"]


@pytest.fixture(scope="session")
def node_name():
    return os.environ["PLEGD_NODE_NAME"]


@pytest.fixture(scope="session")
def history_events():
    return int(os.environ["PLEGD_HISTORY_EVENTS"])


def connect(socket_path):
    # grpcio's default target for a unix socket, no authority override (the README's
    # Python example is these lines).
    channel = grpc.insecure_channel("unix://" + socket_path)
    stub = plegd_pb2_grpc.PlegdStub(channel)
    return channel, stub


@pytest.fixture
def channel(socket_path):
    ch, _ = connect(socket_path)
    yield ch
    ch.close()


@pytest.fixture
def stub(channel):
    return plegd_pb2_grpc.PlegdStub(channel)


@pytest.fixture
def control(control_socket_path):
    ch, stub = connect(control_socket_path)
    yield stub
    ch.close()
