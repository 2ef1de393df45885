#!/bin/bash
# The image's HEALTHCHECK: grpc.health.v1 Check on the daemon's own port
# (DECODED_LISTEN's), through decoded-cli. Exit 0 only on SERVING.
port="${DECODED_LISTEN:-0.0.0.0:50051}"
exec /usr/local/bin/decoded-cli --health --server="127.0.0.1:${port##*:}" --health_timeout_seconds=4
