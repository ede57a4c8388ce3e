# pisync as a container image: a static binary (no cgo) on a base with no shell or
# package manager, run as a non-root user (the uid deploy/kubernetes runs it as).
#   docker build -t pisync:local .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pisync ./cmd/pisync

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/pisync /pisync
USER 10001:10001
ENTRYPOINT ["/pisync"]
CMD ["run"]
