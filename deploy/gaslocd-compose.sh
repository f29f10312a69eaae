#!/bin/sh
# Entry point of the compose services (installed in the image as gaslocd-compose).
#
#   gaslocd-compose start [FLAGS]  first daemon of a run; writes its bootstrap address to
#                                  $GASLOCD_BOOTSTRAP_FILE (a volume the workers share)
#   gaslocd-compose join [FLAGS]   waits for that file (or takes $GASLOCD_BOOTSTRAP_ADDR,
#                                  e.g. a bootstrap at another site) and joins through it
#   gaslocd-compose ARGS...        plain `gaslocd ARGS...`
#
# Why a file: the bootstrap multiaddr ends in the node's peer id, which is made on the
# first start (and then kept in identity.key on the checkpoint volume, so a restarted
# bootstrap resumes its checkpoint under the same address), so it cannot be written into
# compose.yaml.
# Peers must dial each container at an address they can reach: unless GASLOCD_ANNOUNCE is
# set, this announces the container's own address on the compose network.
set -eu

addr_file="${GASLOCD_BOOTSTRAP_FILE:-/run/gaslocd/bootstrap.addr}"
wait_s="${GASLOCD_BOOTSTRAP_WAIT_S:-300}"

if [ -z "${GASLOCD_ANNOUNCE:-}" ]; then
    GASLOCD_ANNOUNCE="$(hostname -i | awk '{print $1}')"
    export GASLOCD_ANNOUNCE
fi

case "${1:-}" in
start)
    shift
    rm -f "$addr_file" # a stale address names the previous start's peer id
    exec gaslocd start --address-file "$addr_file" "$@"
    ;;
join)
    shift
    bootstrap="${GASLOCD_BOOTSTRAP_ADDR:-}"
    waited=0
    # The daemon writes the file whole with a final newline: a counted line is complete.
    while [ -z "$bootstrap" ]; do
        if [ -f "$addr_file" ] && [ "$(wc -l <"$addr_file")" -ge 1 ]; then
            bootstrap="$(head -n 1 "$addr_file")"
        elif [ "$waited" -ge "$wait_s" ]; then
            echo "gaslocd-compose: no bootstrap address in $addr_file after ${wait_s} s" >&2
            exit 3
        else
            sleep 1
            waited=$((waited + 1))
        fi
    done
    echo "gaslocd-compose: joining through $bootstrap"
    exec gaslocd join --bootstrap "$bootstrap" "$@"
    ;;
*)
    exec gaslocd "$@"
    ;;
esac
