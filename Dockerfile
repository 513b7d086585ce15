# syntax=docker/dockerfile:1
# The operator (manager) image: `make docker-build IMG=...` (multi-arch: `make docker-buildx`).
# A static binary (CGO_ENABLED=0, -trimpath, version in -ldflags) on distroless/static, run as the
# nonroot user. test/packaging/images builds the binary with this file's `go build` line and checks it.

ARG GO_VERSION=1.26
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS builder
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
WORKDIR /workspace
COPY go.mod go.sum ./
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
COPY dataplane/ dataplane/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/manager ./cmd/manager

FROM gcr.io/distroless/static:nonroot
LABEL org.opencontainers.image.title="coordinator-operator" \
      org.opencontainers.image.source="https://github.com/epd-dev/coordinator"
WORKDIR /
COPY --from=builder /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
