#!/usr/bin/env bash
# Real ZooKeeper for development and the demo: Debian's package, on 127.0.0.1, with throw-away
# data directories under $ZKLOCK_ZK_DIR (default /tmp/zklock-zookeeper).
#
#   scripts/zookeeper.sh install              install Debian's zookeeper (+ Curator for interop tests)
#   scripts/zookeeper.sh start [standalone|ensemble] [PORT]
#                                              start one server on PORT (default 2181), or three on
#                                              PORT, PORT+1, PORT+2 (peer ports PORT+100.., PORT+200..)
#   scripts/zookeeper.sh stop                 stop what `start` started (by recorded PID)
#   scripts/zookeeper.sh status               print each server's mode, or "not running"
#
# The test suite does not need this script to start servers (its harness starts its own);
# it needs `install`.
set -euo pipefail

DIR=${ZKLOCK_ZK_DIR:-/tmp/zklock-zookeeper}
JAR=/usr/share/java/zookeeper.jar
CONF=/etc/zookeeper/conf

die() { echo "zookeeper.sh: $*" >&2; exit 1; }

install() {
  if [[ -f $JAR && -f /usr/share/java/curator-recipes.jar ]]; then
    return 0
  fi
  command -v apt-get >/dev/null || die "apt-get not found: install ZooKeeper 3.8 and Apache Curator 5 by hand"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq zookeeper libcurator-recipes-java openssl >/dev/null
  [[ -f $JAR ]] || die "the zookeeper package did not install $JAR"
}

four() { # four-letter command to 127.0.0.1:$1
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    s.sendall(sys.argv[2].encode()); out = b""
    while chunk := s.recv(4096): out += chunk
    print(out.decode())
except OSError:
    sys.exit(1)
PY
}

start_one() { # id port [ensemble member lines]
  local id=$1 port=$2 dir=$DIR/server$1
  mkdir -p "$dir/data"
  if [[ -f $dir/pid ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    die "server $id is already running (pid $(cat "$dir/pid")); run: $0 stop"
  fi
  cat >"$dir/zoo.cfg" <<CFG
tickTime=500
initLimit=20
syncLimit=10
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
${3:-}
CFG
  [[ -z ${3:-} ]] || echo "$id" >"$dir/data/myid"
  nohup java -Xmx256m -Dzookeeper.log.dir="$dir" -cp "$CONF:$JAR" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" >"$dir/zookeeper.log" 2>&1 &
  echo $! >"$dir/pid"
  echo "$port" >"$dir/port"
}

wait_up() {
  local port=$1
  for _ in $(seq 1 200); do
    if four "$port" srvr | grep -q "Mode:"; then return 0; fi
    sleep 0.1
  done
  die "ZooKeeper on 127.0.0.1:$port did not come up; see $DIR/server*/zookeeper.log"
}

start() {
  install
  local kind=${1:-standalone} port=${2:-2181}
  case $kind in
    standalone)
      start_one 1 "$port"
      wait_up "$port"
      echo "zookeeper $(four "$port" srvr | sed -n 's/^Zookeeper version: \([0-9.]*\).*/\1/p') standalone at 127.0.0.1:$port"
      ;;
    ensemble)
      local members="" i
      for i in 1 2 3; do
        members+="server.$i=127.0.0.1:$((port + 99 + i)):$((port + 199 + i))"$'\n'
      done
      for i in 1 2 3; do start_one "$i" $((port + i - 1)) "$members"; done
      for i in 1 2 3; do wait_up $((port + i - 1)); done
      echo "zookeeper ensemble at 127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
      ;;
    *) die "unknown kind '$kind': use standalone or ensemble" ;;
  esac
}

stop() {
  local pidfile found=0
  for pidfile in "$DIR"/server*/pid; do
    [[ -f $pidfile ]] || continue
    found=1
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  [[ $found -eq 1 ]] && rm -rf "$DIR" && echo "stopped" || echo "nothing to stop"
}

status() {
  local portfile any=0
  for portfile in "$DIR"/server*/port; do
    [[ -f $portfile ]] || continue
    any=1
    local port; port=$(cat "$portfile")
    echo "127.0.0.1:$port $(four "$port" srvr | grep Mode: || echo 'not running')"
  done
  [[ $any -eq 1 ]] || echo "not running"
}

case ${1:-} in
  install) install ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
