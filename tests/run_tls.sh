#!/usr/bin/env bash
# Who may connect over the network (issue 17, item 4): a tls: listener
# accepts the keys in its --tls-psk-file and refuses a wrong key, an unknown
# identity, a guest without a key and a plain TCP guest; with certificates
# (made here with certtool, Debian's gnutls-bin: missing, the test fails) it
# accepts a client certificate of its --tls-client-ca and refuses one of
# another CA or none, and a guest refuses a host certificate of a CA it
# does not trust or for another name; a tcp: listener with a token refuses a
# wrong or missing token; a listener other machines reach does not start
# without authentication; the host goes on serving after every refusal.
# Each refusal's message names the cause on the side that can act on it.
#   tests/run_tls.sh BUILD_DIR        (ctest: stream_auth)
set -uo pipefail
B=$1
T=$(mktemp -d /tmp/apir-tls-XXXXXX)
HOST_PID=
fails=0 n=0
cleanup() { [ -n "$HOST_PID" ] && kill "$HOST_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

# Hosts take lanes (stream_proto.h) whatever this machine's CPUs; guests ask only where told.
export APIR_HOST_LANES=4
export -n APIR_STREAM_LANES 2>/dev/null; unset APIR_STREAM_LANES
key() { echo "$1:$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"; }
check() { # what, then a command that must succeed
  local what=$1; shift
  n=$((n + 1))
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
# apir ping with the guest environment in front: exit status, stderr in $T/err
ping_as() { env "$@" "$B/apir" ping -n 3 "$EP" >"$T/out" 2>"$T/err"; }
err_has() { grep -q -- "$1" "$T/err" || { echo "  stderr: $(cat "$T/err")"; false; }; }
# The host logs a refusal as the guest hears of it, from another process (a worker's lines are
# relayed): wait for the line a while (under load it came after the guest had exited).
log_has() {
  local i
  for i in $(seq 1 250); do grep -q -- "$1" "$T/host.log" && return 0; sleep 0.02; done
  echo "  no /$1/ in the host log"; tail -5 "$T/host.log"; false
}

start_host() { # extra apir-host options
  : >"$T/host.log"
  "$B/apir-host" --listen "unix:$T/h.sock" --threads 1 --log-level info "$@" >"$T/host.log" 2>&1 &
  HOST_PID=$!
  EP=
  for _ in $(seq 1 500); do
    EP=$(grep -o 'serving t[cl][ps]:[0-9.]*:[0-9]*' "$T/host.log" | head -1 | cut -d' ' -f2)
    [ -n "$EP" ] && return 0
    kill -0 "$HOST_PID" 2>/dev/null || break
    sleep 0.01
  done
  echo "apir-host did not start:"; cat "$T/host.log"; exit 1
}
stop_host() { kill "$HOST_PID" 2>/dev/null; wait "$HOST_PID" 2>/dev/null; HOST_PID=; }

key alice >"$T/keys"; key bob >>"$T/keys"; chmod 600 "$T/keys"
head -1 "$T/keys" >"$T/alice.key"
key alice >"$T/alice-wrong.key"
key carol >"$T/carol.key"

for isolation in process thread; do
  echo "== tls:, --isolation $isolation"
  iso=(--isolation "$isolation")
  [ "$isolation" = thread ] && iso+=(--insecure-shared-process)
  start_host --listen tls:127.0.0.1:0 --tls-psk-file "$T/keys" "${iso[@]}" --handshake-timeout-ms 2000
  check "the right key is accepted" ping_as APIR_TLS_PSK_FILE="$T/alice.key"
  check "  and the host names its identity" log_has 'TLS 1.3, key "alice"'
  # With a pre-shared key NORMAL's order gave ChaCha20 (AES-256-GCM needs SHA-384): a tenth of
  # AES-GCM's speed where the CPU has AES instructions (transport/tls.c).
  if grep -qw aes /proc/cpuinfo && grep -qw pclmulqdq /proc/cpuinfo; then
    check "  and the record cipher is AES-128-GCM (the CPU has AES)" log_has 'key "alice" (AES-128-GCM'
  fi
  check "a second identity of the file too" ping_as APIR_TLS_PSK="$(sed -n 2p "$T/keys")"
  check "a wrong key is refused" bash -c "! env APIR_TLS_PSK_FILE='$T/alice-wrong.key' '$B/apir' ping '$EP' 2>'$T/err'"
  check "  the guest is told" err_has "TLS handshake failed"
  check "  the host says which identity" log_has 'identity "alice" with a wrong key'
  check "an unknown identity is refused" bash -c "! env APIR_TLS_PSK_FILE='$T/carol.key' '$B/apir' ping '$EP' 2>'$T/err'"
  check "  the host names it" log_has 'key identity "carol" is not one'
  check "no key: refused before connecting" bash -c "! env -u APIR_TLS_PSK_FILE -u APIR_TLS_PSK '$B/apir' ping '$EP' 2>'$T/err'"
  check "  the guest is told what to set" err_has "APIR_TLS_PSK_FILE"
  plain=tcp:${EP#tls:}
  check "a plain TCP guest is refused" bash -c "! '$B/apir' ping '$plain' 2>'$T/err'"
  check "  (it reads no hello)" err_has "no hello"
  # A silent peer holds nothing past the handshake deadline.
  exec 7<>"/dev/tcp/127.0.0.1/${EP##*:}"
  sleep 2.5
  check "a silent peer is closed at the handshake deadline" log_has "no answer.* in 2000 ms"
  exec 7>&-
  check "the host still serves after all that" ping_as APIR_TLS_PSK_FILE="$T/alice.key"
  # Payloads of 128 KiB and more are read by the guest's read thread (forced on: off on 2 CPUs);
  # apir-bench compares every byte it reads back with what it wrote, and fails if one differs.
  check "payloads read by the guest's read thread come back whole" env APIR_TLS_READ_THREAD=1 APIR_PROFILE=1 \
    APIR_TLS_PSK_FILE="$T/alice.key" "$B/apir-bench" --endpoint "$EP" --frontend "$B/libggml-apir.so" --mib 4 \
    --calls 20 --nodes 10 >"$T/out" 2>"$T/err"
  check "  and the thread read them" grep -qE 'MiB, [1-9][0-9.]* of them by the read thread' "$T/err"
  # Lanes over TLS, each with a TLS session of its own (with workers only): payloads of 64 KiB or
  # more split over 2 lanes, every byte compared.
  check "payloads over 2 lanes come back whole" env APIR_STREAM_LANES=2 APIR_STREAM_LANE_MIN_KB=64 APIR_PROFILE=1 \
    APIR_TLS_PSK_FILE="$T/alice.key" "$B/apir-bench" --endpoint "$EP" --frontend "$B/libggml-apir.so" --mib 4 \
    --calls 20 --nodes 10 >"$T/out" 2>"$T/err"
  if [ "$isolation" = process ]; then
    check "  over 2 TLS lanes" grep -qE 'lanes: 2, [1-9]' "$T/err"
    check "  the host says they joined, each with TLS" log_has 'lane 2 joined .*, TLS)'
  else
    check "  on one connection (thread mode: no TLS lanes)" bash -c "! grep -q 'lanes:' '$T/err'"
  fi
  stop_host
done

echo "== tls: with certificates"
if ! command -v certtool >/dev/null; then
  echo "FAIL certtool not found: install gnutls-bin (scripts/setup.sh does) - the certificate checks cannot run"
  exit 1
fi
# cert NAME CA|self TEMPLATE-LINES...: NAME.key, NAME.pem (ECDSA, a day)
cert() {
  local name=$1 ca=$2; shift 2
  printf '%s\n' "$@" "expiration_days = 1" >"$T/$name.tmpl"
  certtool --generate-privkey --key-type ecdsa --outfile "$T/$name.key" 2>>"$T/certtool.log" || return 1
  if [ "$ca" = self ]; then
    certtool --generate-self-signed --load-privkey "$T/$name.key" --template "$T/$name.tmpl" \
      --outfile "$T/$name.pem" 2>>"$T/certtool.log"
  else
    certtool --generate-certificate --load-privkey "$T/$name.key" --load-ca-certificate "$T/$ca.pem" \
      --load-ca-privkey "$T/$ca.key" --template "$T/$name.tmpl" --outfile "$T/$name.pem" 2>>"$T/certtool.log"
  fi
}
if ! { cert ca self 'cn = "apir test CA"' ca cert_signing_key &&
  cert server ca 'cn = "apir test host"' 'dns_name = "localhost"' 'ip_address = "127.0.0.1"' tls_www_server signing_key &&
  cert client ca 'cn = "guest-1"' 'organization = "apir tests"' tls_www_client signing_key &&
  cert other-ca self 'cn = "another CA"' ca cert_signing_key &&
  cert rogue other-ca 'cn = "rogue-guest"' tls_www_client signing_key; }; then
  echo "FAIL certtool could not make the test certificates:"; tail -5 "$T/certtool.log"; exit 1
fi
guest_ca="APIR_TLS_CA_FILE=$T/ca.pem"
guest_cert="APIR_TLS_CERT_FILE=$T/client.pem APIR_TLS_KEY_FILE=$T/client.key"
refused() { # guest environment...: apir ping must fail
  ! env -u APIR_TLS_PSK_FILE -u APIR_TLS_PSK "$@" "$B/apir" ping "$EP" >"$T/out" 2>"$T/err"
}
for isolation in process thread; do
  echo "== tls: certificates, --isolation $isolation"
  if [ "$isolation" = process ]; then
    start_host --listen tls:127.0.0.1:0 --tls-cert "$T/server.pem" --tls-key "$T/server.key" \
      --tls-client-ca "$T/ca.pem" --isolation process --handshake-timeout-ms 2000
  else  # the environment's names for the same
    APIR_HOST_TLS_CERT_FILE=$T/server.pem APIR_HOST_TLS_KEY_FILE=$T/server.key \
      APIR_HOST_TLS_CLIENT_CA_FILE=$T/ca.pem start_host --listen tls:127.0.0.1:0 --isolation thread --insecure-shared-process
  fi
  check "the host says it wants client certificates" log_has "TLS 1.3, client certificates"
  # shellcheck disable=SC2086 # the guest's variables, one word each
  check "the right certificates are accepted (ping)" ping_as $guest_ca $guest_cert
  # shellcheck disable=SC2086
  check "  and a command round trip (info)" env $guest_ca $guest_cert "$B/apir" info "$EP" >"$T/out" 2>"$T/err"
  check "  the host names the guest's subject" log_has 'TLS 1.3, certificate "CN=guest-1,O=apir tests"'
  # shellcheck disable=SC2086
  check "the host reached by its name (localhost) too" env $guest_ca $guest_cert "$B/apir" ping "tls:localhost:${EP##*:}" >"$T/out" 2>"$T/err"
  check "a client certificate of another CA is refused" refused "$guest_ca" APIR_TLS_CERT_FILE="$T/rogue.pem" APIR_TLS_KEY_FILE="$T/rogue.key"
  check "  the host names it and why" log_has 'certificate "CN=rogue-guest": not signed by a trusted CA'
  check "  the guest is told" err_has "refused: TLS alert"
  check "no client certificate is refused" refused "$guest_ca"
  check "  the host says so" log_has "presented no certificate"
  check "  the guest is told" err_has 'refused: TLS alert "Certificate is required"'
  # shellcheck disable=SC2086
  check "a host certificate of a CA the guest does not trust is refused" refused APIR_TLS_CA_FILE="$T/other-ca.pem" $guest_cert
  check "  the guest says why" err_has "host's certificate \"CN=apir test host\": not signed by a trusted CA"
  # shellcheck disable=SC2086
  check "a host certificate for another name is refused" refused $guest_ca $guest_cert APIR_TLS_SERVER_NAME=gpu.example.org
  check "  the guest says why" err_has 'is not for "gpu.example.org"'
  # shellcheck disable=SC2086
  check "APIR_TLS_SERVER_NAME names the host as its certificate does" ping_as $guest_ca $guest_cert APIR_TLS_SERVER_NAME=localhost
  check "a guest with a key only is refused" refused APIR_TLS_PSK_FILE="$T/alice.key"
  check "a guest without a CA is told what to set" refused
  check "  (APIR_TLS_CA_FILE)" err_has "APIR_TLS_CA_FILE"
  # shellcheck disable=SC2086
  check "the host still serves after all that" ping_as $guest_ca $guest_cert
  stop_host
done

echo "== tls: keys and certificates together"
start_host --listen tls:127.0.0.1:0 --tls-psk-file "$T/keys" --tls-cert "$T/server.pem" --tls-key "$T/server.key" \
  --tls-client-ca "$T/ca.pem" --handshake-timeout-ms 2000
check "the host offers both" log_has "pre-shared keys or client certificates"
check "a key is accepted" ping_as APIR_TLS_PSK_FILE="$T/alice.key"
check "  named" log_has 'TLS 1.3, key "alice"'
# shellcheck disable=SC2086
check "a certificate is accepted" ping_as $guest_ca $guest_cert
check "  named" log_has 'TLS 1.3, certificate "CN=guest-1'
check "a wrong key is still refused" refused APIR_TLS_PSK_FILE="$T/alice-wrong.key"
check "no client certificate is still refused" refused "$guest_ca"
stop_host

echo "== tls: a host certificate without --tls-client-ca"
"$B/apir-host" --listen "unix:$T/z.sock" --listen tls:0.0.0.0:0 --tls-cert "$T/server.pem" --tls-key "$T/server.key" \
  --isolation thread --insecure-shared-process >"$T/out" 2>"$T/err"
check "on an address other machines reach: does not start" bash -c "[ $? = 1 ] && grep -q 'without authentication of the guests' '$T/err'"
"$B/apir-host" --listen "unix:$T/z.sock" --listen tls:0.0.0.0:0 --tls-psk-file "$T/keys" --tls-cert "$T/server.pem" \
  --tls-key "$T/server.key" --isolation thread --insecure-shared-process >"$T/out" 2>"$T/err"
check "  not even beside keys (a guest without one would get in)" bash -c "[ $? = 1 ] && grep -q 'without authentication of the guests' '$T/err'"
"$B/apir-host" --listen "unix:$T/z.sock" --listen tls:127.0.0.1:0 --tls-client-ca "$T/ca.pem" --isolation thread --insecure-shared-process >"$T/out" 2>"$T/err"
check "--tls-client-ca without --tls-cert does not start" bash -c "[ $? = 1 ] && grep -q 'needs the host.s certificate' '$T/err'"
"$B/apir-host" --listen "unix:$T/z.sock" --listen tls:127.0.0.1:0 --tls-cert "$T/server.pem" --tls-key "$T/client.key" \
  --isolation thread --insecure-shared-process >"$T/out" 2>"$T/err"
check "a key that is not the certificate's does not start" bash -c "[ $? = 1 ] && grep -q 'with key' '$T/err'"
start_host --listen tls:0.0.0.0:0 --tls-cert "$T/server.pem" --tls-key "$T/server.key" --tls-client-ca "$T/ca.pem" --isolation thread --insecure-shared-process
check "tls:0.0.0.0 with --tls-client-ca starts" log_has "serving tls:0.0.0.0"
stop_host
start_host --listen tls:127.0.0.1:0 --tls-cert "$T/server.pem" --tls-key "$T/server.key"
check "on loopback it starts, saying so" log_has "guests not authenticated: this machine only"
check "  a guest with the CA only is served" ping_as "$guest_ca"
check "  the log says it had no certificate" log_has "TLS 1.3, no client certificate"
stop_host

echo "== tcp: with a token"
echo "s3cret-token-for-tests" >"$T/token"; chmod 600 "$T/token"
start_host --listen tcp:127.0.0.1:0 --token-file "$T/token"
check "the token is accepted" ping_as APIR_TOKEN_FILE="$T/token"
check "a wrong token is refused" bash -c "! env APIR_TOKEN=nope '$B/apir' ping '$EP' 2>'$T/err'"
check "  the guest is told" err_has "wrong token"
check "no token is refused" bash -c "! env -u APIR_TOKEN -u APIR_TOKEN_FILE '$B/apir' ping '$EP' 2>'$T/err'"
check "  the guest is told" err_has "token is required"
check "a TLS guest on a plain listener fails" bash -c "! env APIR_TLS_PSK_FILE='$T/alice.key' '$B/apir' ping 'tls:${EP#tcp:}' 2>'$T/err'"
check "the host still serves" ping_as APIR_TOKEN_FILE="$T/token"
stop_host

echo "== listeners other machines reach"
"$B/apir-host" --listen "unix:$T/x.sock" --listen tcp:0.0.0.0:0 --isolation thread --insecure-shared-process >"$T/out" 2>"$T/err"
check "tcp:0.0.0.0 without a token does not start" bash -c "[ $? = 1 ] && grep -q 'refused without authentication' '$T/err'"
"$B/apir-host" --listen "unix:$T/y.sock" --listen tls:0.0.0.0:0 --isolation thread --insecure-shared-process >"$T/out" 2>"$T/err"
check "tls: without --tls-psk-file does not start" bash -c "[ $? = 1 ] && grep -q 'needs the guests. keys' '$T/err'"
start_host --listen tls:0.0.0.0:0 --tls-psk-file "$T/keys" --isolation thread --insecure-shared-process
check "tls:0.0.0.0 with keys starts (no token needed)" log_has "serving tls:0.0.0.0"
stop_host
chmod 644 "$T/keys"
start_host --listen tls:127.0.0.1:0 --tls-psk-file "$T/keys" --isolation thread --insecure-shared-process
check "a key file others may read is warned about" log_has "readable by others"
stop_host

echo "stream_auth: $((n - fails)) passed, $fails failed"
[ "$fails" = 0 ]
