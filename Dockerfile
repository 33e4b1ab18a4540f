# syntax=docker/dockerfile:1
#
# Hourglass container image: a stripped release binary on debian:bookworm-slim, running as an
# unprivileged user. BuildKit is needed for the cache mounts (the default builder since Docker 23).
#
#   docker build -t hourglass .
#   docker run --rm -p 8080:8080 -p 9090:9090 -e OPENAI_API_KEY -e ANTHROPIC_API_KEY hourglass
#
# The image serves /etc/hourglass/hourglass.toml (docker/hourglass.toml: OpenAI and Anthropic,
# listeners on 0.0.0.0). Mount your own file there, or point HOURGLASS_CONFIG elsewhere. Any
# subcommand works as the container's command: `docker run --rm hourglass check`,
# `docker run hourglass fake-upstream --listen 0.0.0.0:8089`. (`hourglass demo` binds
# 127.0.0.1 and is for a workstation, not a container: docker/compose.yaml is the container demo.)

ARG RUST_VERSION=1.95

# ---- build ---------------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# The context is what .dockerignore lets through: the manifest, the lock file, src/, fake/ (the
# fake provider's crate, which `hourglass demo` runs), config/ (config/demo.toml is compiled
# into the binary) and the target folders Cargo.toml may name
# (tests/, benches/, examples/, build.rs); target/, .git/ and the rest stay out.
COPY . .
# [profile.release] keeps line tables (debug = 1) for profiling on a workstation; the image ships
# a stripped binary instead.
ENV CARGO_PROFILE_RELEASE_DEBUG=0 \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_TERM_COLOR=never
# The registry and target directory live in cache mounts, so a rebuild after a source change
# recompiles only the hourglass crate. The binary is copied out because cache mounts are not
# part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin hourglass \
 && install -D -m 0755 target/release/hourglass /out/hourglass \
 && /out/hourglass --version

# ---- runtime -------------------------------------------------------------------------------
# bookworm-slim rather than distroless: same glibc as the builder, and bash for the HEALTHCHECK
# below (the image has no curl). Provider TLS roots are compiled in (webpki-roots), so no
# ca-certificates package is needed.
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 hourglass \
 && useradd --system --uid 10001 --gid hourglass --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin hourglass
COPY --from=build /out/hourglass /usr/local/bin/hourglass
COPY docker/hourglass.toml /etc/hourglass/hourglass.toml
ENV HOURGLASS_CONFIG=/etc/hourglass/hourglass.toml
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# 8080: clients (the gateway). 9090: admin (/metrics, /healthz, /readyz); keep it private.
EXPOSE 8080 9090
# Hourglass drains in-flight streams on SIGTERM for up to [server] shutdown_grace (default 30s):
# give the container longer than that to stop (`docker stop -t 40`, compose's stop_grace_period,
# Kubernetes' terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
# Liveness over the admin port with bash's /dev/tcp (no curl in the image). It assumes the admin
# listener is on port 9090 (any address: 0.0.0.0 includes 127.0.0.1); override it (compose
# `healthcheck:`) when the config moves the port or the container runs another subcommand.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9090 && printf 'GET /healthz HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && IFS= read -r -t 2 status <&3 && [[ $status == 'HTTP/1.1 200'* ]]"]
ENTRYPOINT ["hourglass"]
