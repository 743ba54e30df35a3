# The tilert image: one binary, every role. The role is the container's
# command:
#
#   docker build -t tilert .
#   docker run --rm tilert version
#   docker run --gpus all -v /models:/models -p 5556:5556 -p 5557:5557 tilert \
#       decode --model glm5 --model-weights-dir /models/glm5-tilert --with-mtp ...
#
# deploy/compose.yaml runs the CPU stack (decode node + dev-vllm + router).
#
# The binary is built with CGO_ENABLED=0, but it opens libcuda, NVRTC and
# NIXL at run time through purego, which needs glibc's dynamic loader: so
# the base is distroless/base (glibc, CA certificates, no shell, no package
# manager), not distroless/static. On a GPU host the NVIDIA container
# toolkit mounts the driver's libraries; NVRTC comes from the CUDA runtime
# (mount it and set TILERT_NVRTC, or extend this image with it).
ARG GO_IMAGE=golang:1.26
ARG BASE_IMAGE=gcr.io/distroless/base-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-X github.com/tilert-go/tilert/internal/buildinfo.Version=${VERSION} -X github.com/tilert-go/tilert/internal/buildinfo.Commit=${COMMIT}" \
      -o /out/tilert . && \
    /out/tilert version

FROM ${BASE_IMAGE}
COPY --from=build /out/tilert /usr/local/bin/tilert
# The example config documents every key; mount your own over it.
COPY tilert.toml.example /etc/tilert/tilert.toml
USER nonroot
# 5556 ctrl (state handoff), 5557 decode http, 23333 router, 8000 dev-vllm.
EXPOSE 5556 5557 23333 8000
ENTRYPOINT ["/usr/local/bin/tilert"]
CMD ["decode", "--config", "/etc/tilert/tilert.toml"]
