#!/usr/bin/env bash
# Makes a throw-away CA and one TLS certificate per node of the pisync NATS cluster, for a
# test or staging cluster. Production certificates come from your own PKI.
#
#   ./gen-certs.sh [OUT_DIR]          (default OUT_DIR: ./tls)
#
# Environment: NODES (default "node-a node-b node-c"), DOMAIN (default nats.internal),
# DAYS (default 365), EXTRA_SANS (more subjectAltName entries for every node, e.g.
# "DNS:nats.example.org,IP:10.0.0.5").
#
# Result, per node, to copy to that node's /etc/nats/tls/ (the paths common.conf and
# cluster.conf use):
#   OUT_DIR/<node>/ca.pem  OUT_DIR/<node>/server-cert.pem  OUT_DIR/<node>/server-key.pem
# and OUT_DIR/ca.pem for the clients (pisync: --tls-ca / PISYNC_TLS_CA, see deploy/systemd).
# The CA key stays in OUT_DIR/ca-key.pem: keep it offline or delete it.
# Each certificate is valid for <node>.<DOMAIN>, localhost and 127.0.0.1, for server and
# client use (routes authenticate each other with it).
set -euo pipefail

out=${1:-./tls}
nodes=${NODES:-node-a node-b node-c}
domain=${DOMAIN:-nats.internal}
days=${DAYS:-365}
extra=${EXTRA_SANS:-}

command -v openssl >/dev/null || { echo "gen-certs.sh: openssl not found" >&2; exit 1; }
umask 077
mkdir -p "$out"

if [[ ! -f $out/ca.pem ]]; then
	openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		-keyout "$out/ca-key.pem" -out "$out/ca.pem" -days "$days" \
		-subj "/O=pisync/CN=pisync NATS test CA" \
		-addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

ext=$(mktemp)
trap 'rm -f "$ext"' EXIT
for node in $nodes; do
	dir=$out/$node
	mkdir -p "$dir"
	sans="DNS:$node.$domain,DNS:$node,DNS:localhost,IP:127.0.0.1"
	[[ -n $extra ]] && sans="$sans,$extra"
	printf '%s\n' \
		"basicConstraints=critical,CA:FALSE" \
		"keyUsage=critical,digitalSignature,keyEncipherment" \
		"extendedKeyUsage=serverAuth,clientAuth" \
		"subjectAltName=$sans" >"$ext"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		-keyout "$dir/server-key.pem" -out "$dir/server.csr" \
		-subj "/O=pisync/CN=$node.$domain" 2>/dev/null
	openssl x509 -req -in "$dir/server.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
		-set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
		-extfile "$ext" -out "$dir/server-cert.pem" 2>/dev/null
	rm -f "$dir/server.csr"
	cp "$out/ca.pem" "$dir/ca.pem"
	chmod 0644 "$dir/ca.pem" "$dir/server-cert.pem"
	echo "$dir: server-cert.pem server-key.pem ca.pem ($sans)"
done
chmod 0644 "$out/ca.pem"
