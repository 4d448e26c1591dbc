# syntax=docker/dockerfile:1
# One image for the scheduler, the node agent and the kubectl plugin:
#   /usr/local/bin/tessera          (ENTRYPOINT; the chart passes `scheduler …` or `node-agent …`)
#   /usr/local/bin/kubectl-tessera  (copy it out: docker cp, or `kubectl cp` from a pod)
#
#   scripts/release.sh              builds this image and packages the chart, same version
#
# Runtime: distroless "cc" (glibc, no shell, no package manager), user 65532.
# Not static (musl): the node agent dlopen()s libnvidia-ml.so.1, which the NVIDIA
# container runtime injects from the host, and that library needs glibc. The node
# agent's DaemonSet runs the same image as root (runAsUser: 0): it writes the
# kubelet's device-plugin socket directory, which belongs to root.
#
# scripts/validate-deploy.sh checks (without a Docker daemon) that every path
# copied here exists, that .dockerignore keeps them, and that the binaries copied
# out of target/ are the ones the same cargo profile builds.

ARG RUST_VERSION=1.89

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# The build needs only the workspace (proto/ holds the kubelet APIs that
# tessera-node's build.rs compiles with protox: no protoc).
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY proto proto
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --profile release -p tessera --bins \
 && mkdir -p /out \
 && cp target/release/tessera target/release/kubectl-tessera /out/

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="Tessera GPU scheduler, node agent and kubectl plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/tessera /out/kubectl-tessera /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera"]
